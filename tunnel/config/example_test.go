package config_test

import (
	"errors"
	"fmt"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func ExampleParseServer() {
	cfg, err := config.ParseServer("server.toml", []byte(`
[server]
domain = "tunnel.example.com"

[load_balancing]
enabled = true
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("control:", cfg.Server.Addr(cfg.Server.ControlPort))
	fmt.Println("http:", cfg.Server.Addr(cfg.Server.HTTPPort))
	fmt.Println("https:", cfg.Server.Addr(cfg.Server.HTTPSPort) == "")
	fmt.Println("pools:", cfg.LoadBalancing.Enabled, cfg.LoadBalancing.Strategy)
	fmt.Println("drain:", cfg.Limits.DrainTimeout)
	// Output:
	// control: 0.0.0.0:4040
	// http: 0.0.0.0:8080
	// https: true
	// pools: true least_streams
	// drain: 30s
}

// Every problem names the file, the line and the key.
func ExampleParseServer_errors() {
	_, err := config.ParseServer("server.toml", []byte(`[server]
domian = "tunnel.example.com"

[limits]
tcp_port_range = [30000, 20000]
`))
	fmt.Println(err)

	var list config.ErrorList
	if errors.As(err, &list) {
		fmt.Println(len(list), "problems; first at line", list[0].Line)
	}
	fmt.Println(errors.Is(err, config.ErrUnknownKey))
	// Output:
	// server.toml:1: server.domain: required: the DNS name public host names end in (<subdomain>.<domain>), e.g. "tunnel.example.com"
	// server.toml:2: server.domian: unknown key; did you mean "domain"?
	// server.toml:5: limits.tcp_port_range: low port 30000 is above high port 20000
	// 3 problems; first at line 1
	// true
}

func ExampleParseConnector() {
	cfg, err := config.ParseConnector("config.yml", []byte(`
server: tunnel.example.com:4040
auth_token: "your-token"
tunnels:
  b:
    proto: http
    local_port: 3001
    subdomain: pool
    group: web
    group_key: shared-secret
    health_check:
      type: http
      path: /healthz
  a:
    proto: tcp
    local_port: 5432
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range cfg.Tunnels {
		fmt.Println(t.Name, t.Proto, t.LocalAddr(), t.HealthCheck != nil)
	}
	hc := cfg.Tunnels[0].HealthCheck
	fmt.Println(hc.Type, hc.Path, hc.Interval, hc.Timeout, hc.MaxFailed, hc.Expect2xx)
	// Output:
	// b http 127.0.0.1:3001 true
	// a tcp 127.0.0.1:5432 false
	// http /healthz 10s 3s 3 true
}

func ExampleLoadConnector() {
	cfg, err := config.LoadConnector("../../examples/connector/config.example.yml")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Server, len(cfg.Tunnels), cfg.Tunnels[0].Subdomain)
	// Output:
	// localhost:4040 2 pool
}
