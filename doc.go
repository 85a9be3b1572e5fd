// Package warren is an embeddable SDK for load-balanced reverse tunnels
// (module github.com/warren-tunnel/warren).
//
// An edge (tunnel.NewServer) accepts public HTTP requests and TCP connections and carries them
// over multiplexed tunnels to connectors (tunnel.Dial) that run next to the backends, behind NAT.
// Connectors that present the same group and group key form one pool behind one public hostname
// or TCP port; the edge sends each new request or connection to one healthy member. Several
// edges can serve the same pools as a cluster.
//
//	public client ──▶ edge ──▶ group "web" on pool.example.com ─┬─▶ connector A ──▶ backend :3000
//	                                                            └─▶ connector B ──▶ backend :3001
//
// # Packages
//
//   - tunnel: the edge (Server) and the connector (Session, Tunnel, Listener). Start here.
//   - tunnel/config: server.toml and the connector YAML of the example programs, decoded into
//     the library's values with its defaults, errors naming file, line and key.
//   - tunnel/admin: the edge's operator plane, built from its read-only Operator view: REST
//     API, live event streams, Prometheus metrics and status page. The edge links none of it.
//   - tunnel/cluster: several edges as one, on NATS JetStream: shared routes and pools, leases,
//     authenticated edge-to-edge links (a tunnel.Cluster for ServerConfig.Cluster).
//   - tunnel/store: durable route ownership (route → tenant, pool, key hash, TCP ports): in
//     memory; tunnel/store/boltstore keeps it in an embedded bbolt file, and
//     tunnel/store/natsstore in a NATS JetStream bucket that a cluster's edges share.
//   - tunnel/tunneltest: edges and connectors on loopback for tests, in the style of httptest.
//   - group: the edge's routing table: groups, members, health bits, draining, lock-free picks.
//   - dispatch: how one member is chosen: LeastStreams (default) or Random, both weighted, and
//     Rendezvous for affinity keys (weighted rendezvous hashing with bounded loads).
//   - health: the connector's probes of its local backend (TCP, HTTP, in-process), reporting
//     only changes.
//   - webhook: zero-healthy alerts: Debouncer, Payload and a bounded, SSRF-safe Sender.
//   - internal/wire: the protocol (see internal/wire/spec.md); internal/proxy: the edge's
//     data path; internal/mux: multiplexer plumbing; internal/policy and internal/throttle:
//     endpoint policies and authentication throttles.
//   - examples/edge, examples/connector: thin programs reading server.toml and the connector
//     YAML; examples/demo: an in-process pool that fails over; examples/cluster: two edges on
//     an embedded NATS server, with a failover from one edge to the other.
//
// # An edge in a few lines
//
//	auth, err := tunnel.NewStaticTokens([]string{connectorToken}, nil) // at least 16 characters
//	if err != nil {
//		log.Fatal(err)
//	}
//	srv, err := tunnel.NewServer(tunnel.ServerConfig{
//		Domain:        "tunnel.example.com",
//		LoadBalancing: tunnel.LoadBalancing{Enabled: true},
//		ControlAddr:   ":4040",                              // connectors dial this
//		Public:        tunnel.PublicHTTP{HTTPAddr: ":8080"}, // public HTTP: <subdomain>.tunnel.example.com
//		Auth:          auth,
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	go func() {
//		<-ctx.Done()
//		srv.Shutdown(context.Background())
//	}()
//	if err := srv.ListenAndServe(); !errors.Is(err, tunnel.ErrServerClosed) {
//		log.Fatal(err)
//	}
//
// # A connector in a few lines
//
//	sess, err := tunnel.Dial(ctx, "tunnel.example.com:4040", tunnel.WithToken(connectorToken))
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer sess.Close() // drains: in-flight requests finish first
//	tun, err := sess.Forward(ctx, tunnel.TunnelSpec{
//		Subdomain: "pool",
//		Group:     "web",
//		GroupKey:  "shared-secret-for-this-pool",
//		Health:    &health.Spec{Type: health.TypeTCP},
//	}, "127.0.0.1:3000")
//	if err != nil {
//		log.Fatal(err) // e.g. "group key does not match for subdomain 'pool'"
//	}
//	// A member with a health check starts unhealthy: the edge sends it nothing until its
//	// first probe passes (tun.Health() says when).
//	log.Println("registered", tun.URL())
//	<-ctx.Done()
//
// An in-process backend uses Session.Listen instead, which returns a net.Listener to pass to
// http.Serve. Tests can run a whole edge with package tunnel/tunneltest, or with no sockets:
// Server.Handler serves public HTTP and Server.DialContext attaches connectors
// (tunnel.WithDialer(srv.DialContext)). Behind a corporate proxy, Dial goes through the one
// HTTPS_PROXY or ALL_PROXY names (NO_PROXY respected, as net/http does), or through
// tunnel.WithProxy's (HTTP CONNECT or SOCKS5).
//
// The guide is in the repository's docs/ directory: embedding, running the example programs,
// configuration, load balancing, tenants, cluster, protocols, admin API, behaviour, security,
// benchmarks and reliability.
package warren
