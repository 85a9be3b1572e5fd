// Package natsstore is a route store (store.Store) in a NATS JetStream key-value bucket: the
// store of a cluster, whose edges serving one pool share their routes in one bucket
// (github.com/nats-io/nats.go/jetstream), opened with Open on a connection the caller owns.
// JetStream gives what a shared store needs, so warren runs no consensus of its own:
//
//   - compare-and-set: Update writes create-only (the key is still absent) or at the
//     revision it read, and on a conflict reads again and calls fn again;
//   - replication: a bucket with 3 or 5 replicas survives the loss of a NATS server, and a
//     write is acknowledged once a quorum stored it;
//   - watches and per-key TTLs, which the cluster's other buckets use.
//
// Store keys map to NATS keys reversibly ("http/web" is "http.web"; labels with other
// characters are base64url-encoded): see Store. An edge in a cluster (tunnel.ClusterConfig)
// opens its route store here itself.
package natsstore
