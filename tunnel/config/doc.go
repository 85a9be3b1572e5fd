// Package config reads Warren's configuration files into the library's values: server.toml
// for an edge (examples/edge -config FILE) and the connector's YAML file (examples/connector
// start --config FILE, default ~/.warren/config.yml). It is public so that a program
// embedding an edge or a connector can load the same files as the example mains.
//
// [LoadServer] and [ParseServer] read server.toml into a [Server], the file as written with
// its defaults; [Server.Edge] (or [LoadEdge]) turns it into an [Edge]: the
// tunnel.ServerConfig to run (its TLS files loaded, its tokens checked by an authenticator
// that [Edge.Reload] can replace, its cluster made), and what the program wires around it:
// the admin plane's address and token, the state directory to open, the cluster's
// configuration. [Edge.Reload] applies a new version of the file to the running edge and
// returns each key that differs as a [Change]. [LoadConnector] and [ParseConnector] read the
// connector's file into a [Connector], whose [Connector.DialOptions] and [Tunnel.Spec] are
// the session's options and the tunnels' registrations.
//
// The library's defaults and rules are the library's: a key left out takes the default the
// library gives its field (tunnel.ServerConfig.WithDefaults, cluster.DefaultLeaseTTL,
// health.DefaultInterval, ...), and a value is checked by the library's own checks
// (tunnel.ServerConfig.Validate, tunnel.TunnelSpec.Validate, cluster.Config.Validate,
// tunnel.TokenProblem), whose errors, which name Go fields, are reported under the key
// that set the field. This package adds only what the file itself needs: keys that must be
// written, a value of 0 where the library would read "the default", a few defaults of its
// own where the library has none (the public ports, the TCP port range, the tenant quotas),
// and rules across the file (a port used twice, a token used twice, a tenant that does not
// exist). A new key is a field of the file's struct here and a line of the mapping
// ([Server.Edge], [Tunnel.Spec]); nothing else changes.
//
// Operators migrating from other tunnel tools rewrite these files by hand,
// so every problem is reported precisely: each is an [*Error] naming the
// file, the line and the dotted key, for example
//
//	server.toml:14: limits.tcp_port_range: low port 30000 is above high port 20000
//	config.yml:9: tunnels.a.health_check.path: required when type is "http"
//	server.toml:3: server.domian: unknown key; did you mean "domain"?
//
// All problems of a file are collected into one [ErrorList], ordered by
// line. Only a syntax error stops parsing early, and in server.toml a table
// or a nested array where a value of another type belongs. Unknown keys and values of
// the wrong type are errors. Durations are written in seconds (keys ending
// in _secs), as integers or fractions greater than 0; the few keys whose
// documentation says so also take 0 (off, or no limit).
//
// The package links the cluster package (for cluster.Config) but neither the admin plane
// nor the bbolt store, which an edge's program links itself: a connector that reads its
// file with it stays small.
package config
