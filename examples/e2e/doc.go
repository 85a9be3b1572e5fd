// Package e2e runs the load-balancing scenario of the product documents end to end with the
// real example binaries: it builds examples/edge and examples/connector, writes a
// server.toml and connector YAML files into a temporary directory, starts an edge and
// several connector processes on loopback, and checks what an operator would see: the
// lines the connectors print, requests and TCP connections shared by the members of a
// group, a rejected group key, and clean exits on SIGTERM.
//
// The package holds only tests; run them with
//
//	go test ./examples/e2e
//
// Under -race the binaries are built with the race detector too.
package e2e
