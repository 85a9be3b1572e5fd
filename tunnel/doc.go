// Package tunnel is Warren's public face: the edge (Server) and the connector (Session,
// Tunnel, Listener).
//
// The edge, created with NewServer, accepts connector sessions on its control listener
// (Serve, or ServeConn for one connection, or DialContext for an in-process connector),
// serves public HTTP (ServePublic) and HTTPS (ServePublicTLS), or Handler as an
// http.Handler, and a public TCP port per TCP group; ListenAndServe listens on the
// configured addresses for all of them. Its operator plane (admin API, metrics, status
// page) is package tunnel/admin, built from the edge's read-only Operator view and served
// with ServeAdmin; the edge itself links none of it. In a cluster (ServerConfig.Cluster,
// package tunnel/cluster on NATS JetStream) the other edges' links are served by the
// cluster's ServePeers, which ListenAndServe calls; route ownership is kept by a Store
// (in memory by default, tunnel/store/boltstore on disk, tunnel/store/natsstore in a
// cluster). Reload applies a new configuration to the running edge. Each public
// request (HTTP) or connection (TCP) goes to one healthy, non-draining member of the route's
// pool, chosen by the pool's dispatch.Strategy (least streams by default, or random; affinity
// keys by dispatch.Rendezvous); another member is tried only when no byte of
// the request can have reached an application. A route belongs to one tenant (see
// ServerConfig.Store, Endpoints and Limits). Shutdown drains; Close stops at once.
//
// The connector, created with Dial, keeps one multiplexed connection to an edge, reconnects
// with backoff and registers its tunnels again. Forward registers a tunnel to a local
// address; Listen registers one served in-process through a net.Listener. Session.Close and
// Tunnel.Shutdown drain (the edge stops selecting the member, in-flight work finishes);
// Tunnel.Close returns at once and drains in the background.
//
// Files: server.go and edge_*.go are the edge, connector*.go the connector; errors.go,
// auth.go and the wire types they share are used by both. The data path is in
// internal/proxy, the multiplexer plumbing in internal/mux, the operator plane in package
// tunnel/admin (operator.go is what it reads), the routing table in package group and route
// ownership in package tunnel/store.
package tunnel
