package mux

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"
)

// QUIC is the QUIC transport of connector sessions. Package tunnel/quic registers it
// (RegisterQUIC) when a program imports it, so that quic-go is linked only into programs
// that ask for it; package tunnel asks RegisteredQUIC for it.
type QUIC interface {
	// Dial opens a session to the edge at addr (a UDP "host:port") within ctx, verified
	// as tlsConf says (a copy gets the transport's ALPN and TLS 1.3).
	Dial(ctx context.Context, addr string, tlsConf *tls.Config) (Session, error)
	// Listen accepts connector sessions on pc with tlsConf's certificate (a copy gets the
	// ALPN and TLS 1.3). It does not close pc when closed.
	Listen(pc net.PacketConn, tlsConf *tls.Config, opts ListenOptions) (Listener, error)
}

// ListenOptions tune a QUIC listener.
type ListenOptions struct {
	// OpenTimeout bounds a stream open that waits for the connector's stream credit.
	OpenTimeout time.Duration
	// HandshakeTimeout bounds the QUIC handshake of a new connection.
	HandshakeTimeout time.Duration
	// Admit, if set, is asked about each new connection before the edge spends anything on
	// its handshake, with its source address, which a Retry has validated (so a spoofed
	// address takes no place): nil refuses the connection (CONNECTION_REFUSED). An Admission
	// is released when its connection ends, and Accept hands it to the caller, who may
	// release it sooner.
	Admit func(remote net.Addr) Admission
}

// Admission is a place a listener's Admit gave a new connection (the edge's pre-auth slot).
type Admission interface{ Release() }

// Listener accepts the sessions of connectors over QUIC.
type Listener interface {
	// Accept waits for the next session whose handshake completed, and returns it with
	// the Admission Admit gave it (nil without Admit).
	Accept(ctx context.Context) (Session, Admission, error)
	// Close stops accepting; the sessions accepted go on.
	Close() error
	// Addr is the UDP address listened on.
	Addr() net.Addr
}

var quicTransport atomic.Pointer[QUIC]

// RegisterQUIC makes q the QUIC transport (package tunnel/quic, from its init).
func RegisterQUIC(q QUIC) { quicTransport.Store(&q) }

// RegisteredQUIC returns the QUIC transport, or nil when package tunnel/quic is not linked.
func RegisteredQUIC() QUIC {
	if q := quicTransport.Load(); q != nil {
		return *q
	}
	return nil
}

// Tuning shared with the QUIC transport, so that a session over QUIC notices a dead peer
// as soon as one over yamux does.
const (
	// KeepAliveInterval is how often each side pings an idle session.
	KeepAliveInterval = keepAliveInterval
	// DeadPeerTimeout is how long a session may hear nothing from its peer before it ends:
	// the keep-alive interval plus yamux's write timeout, yamux's bound on noticing a dead
	// peer.
	DeadPeerTimeout = keepAliveInterval + connWriteTimeout
	// StreamCloseTimeout bounds how long a stream this side closed waits for the peer's
	// end before its receive side is given up.
	StreamCloseTimeout = streamCloseTimeout
)
