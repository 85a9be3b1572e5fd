// Package cluster makes edges one cluster through NATS JetStream: a tunnel.Cluster for
// ServerConfig.Cluster. Every edge of a cluster shares its routes and pools with the others
// and reaches their members over an authenticated edge-to-edge link, so a pool whose members
// are attached to different edges is one pool on every edge.
//
//	c, err := cluster.New(cluster.Config{
//		NATSURLs:  []string{"nats://nats-1:4222", "nats://nats-2:4222", "nats://nats-3:4222"},
//		Advertise: "10.0.0.5:7946", // where the other edges reach this one
//		Token:     clusterToken,    // the same on every edge
//		Replicas:  3,
//	})
//	if err != nil {
//		return err
//	}
//	srv, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "tunnel.example.com",
//		LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Cluster: c})
//
// The edge starts the cluster in NewServer (Join and Start), serves the other edges' links
// with ListenAndServe (or ServePeers on a listener of your own), and leaves it in Shutdown
// or Close. docs/reliability.md says what holds while NATS or an edge is lost.
package cluster
