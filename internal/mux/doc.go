// Package mux is the plumbing both sides of a Warren session share: the yamux configuration
// and session constructors (Client, Server), the connection yamux runs over (which joins each
// data frame's header and body into one write), the two-way byte pipe between a stream and a
// local connection (Join) with its pooled copy buffers (BufferPool), and the connector's
// tracker that tells the edge when a backend reset its connection with a request unread
// (NewUnreadConn).
//
// Nothing here knows about servers, sessions or tunnels: callers pass in what a function
// needs (a logger, a timeout, a key).
package mux
