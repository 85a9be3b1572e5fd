// Package e2e runs the load-balancing scenario of the product documents end to end with the
// real example binaries: it builds examples/edge and examples/connector, writes a
// server.toml and connector YAML files into a temporary directory, starts an edge and
// several connector processes on loopback, and checks what an operator would see: the
// lines the connectors print, requests and TCP connections shared by the members of a
// group, a rejected group key, and clean exits on SIGTERM. It also runs the load-balancing
// policies (weights, a backup tier, idempotent retry and outlier ejection when a backend
// dies, a rolling group key rotation) through the mains, tenants against each other, a
// cluster of two edge processes on an embedded NATS server with one of them killed by SIGKILL
// under load (cluster_test.go), a few hundred anonymous clients declaring request bodies they
// never send, which the edge answers and closes (bodies_test.go), public clients that stop
// reading large downloads while the edge's memory is measured (stall_test.go), and the edge's
// status page in headless Chromium (browser_test.go; skipped without Chromium unless
// WARREN_REQUIRE_BROWSER is set). gRPC through HTTP, HTTPS and TLS passthrough tunnels runs
// with grpc-go against an edge and connectors in this process, on the library's public API
// (grpc_test.go, inproc_test.go). The nemesis (nemesis_test.go, issue 28) runs three edges,
// a three-node NATS cluster (nats-server processes, JetStream on disk) and two tenants'
// connectors as processes under a seeded schedule of kills and stops, records every request
// and TCP connection in a history and checks it: no answer from another tenant's member, no
// TCP port leading to two pools, failures only in a fault's window, the cluster converged
// after the last fault.
//
// It is a module of its own (a replace points it at the library), so that the library's
// go.mod does not require chromedp or grpc-go; the binaries are built in the library's
// module all the same. The package holds only tests; from the repository's root, run them
// with
//
//	go -C examples/e2e test .
//
// Under -race the binaries are built with the race detector too.
//
// The documentation's code blocks run in the package doctest beside it, by the conventions of
// its package comment and docs/contributing-docs.md.
package e2e
