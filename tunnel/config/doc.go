// Package config reads Warren's configuration files into the library's values: server.toml
// for an edge (examples/edge -config FILE) and the connector's YAML file (examples/connector
// start --config FILE, default ~/.warren/config.yml). It is public so that a program
// embedding an edge or a connector can load the same files as the example mains.
//
// [LoadServer] and [LoadConnector] read a file, [ParseServer] and
// [ParseConnector] parse bytes; all four apply the documented defaults,
// validate every rule and return plain structs ([Server], [Connector]) that the
// mains convert into the tunnel package's options. go-toml and yaml.v3
// decode the files; the toml and yaml struct tags name the key each field is
// read from. Subdomains, tunnel names and alert webhook URLs are checked by
// the group and webhook packages' own validators.
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
// in _secs), as integers or fractions greater than 0.
package config
