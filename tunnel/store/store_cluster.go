// # Cluster: NATS JetStream
//
// NATS is the cluster implementation: several edges serving one pool share their routes in
// one NATS JetStream key-value bucket (github.com/nats-io/nats.go/jetstream), opened with
// OpenNATS on a connection the caller owns. JetStream gives what a shared store needs, so
// warren runs no consensus of its own:
//
//   - compare-and-set: Update writes create-only (the key is still absent) or at the
//     revision it read, and on a conflict reads again and calls fn again;
//   - replication: a bucket with 3 or 5 replicas survives the loss of a NATS server, and a
//     write is acknowledged once a quorum stored it;
//   - watches and per-key TTLs, for the cluster's later steps.
//
// Store keys map to NATS keys reversibly ("http/web" is "http.web"; labels with other
// characters are base64url-encoded): see NATS. The edge does not use NATS yet; a later step
// wires it to the edge's [cluster] configuration.
package store

// This file holds one section of the package comment: go doc appends the comments of a
// package's files in file name order, and this name sorts after store.go's.
