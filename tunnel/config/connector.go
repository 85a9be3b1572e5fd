package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// Health check types accepted by [HealthCheck.Type]: the library's, but for health.TypeFunc,
// which only a program can give.
const (
	// HealthTCP succeeds when a TCP connection to the local service opens.
	HealthTCP = string(health.TypeTCP)
	// HealthHTTP succeeds when a GET of Path answers (with a 2xx status
	// when Expect2xx).
	HealthHTTP = string(health.TypeHTTP)
)

// MaxDataReadBuffer bounds data_read_buffer (connector) and server.data_read_buffer (edge):
// 256 MiB, far above any link's bandwidth-delay product worth a fixed buffer.
const MaxDataReadBuffer = 256 << 20

// Connector is the connector's configuration file (config.yml) after defaults
// have been applied. Each field mirrors one key of the file.
type Connector struct {
	// File is the name the configuration was parsed from; it prefixes every
	// error that Validate returns.
	File string `yaml:"-"`
	// Server is the edge's control address, "host:port"; with Transport websocket, the
	// URL of its WebSocket, "wss://edge.example.com/_warren/connect". Exactly one of
	// Server and Servers is set.
	Server string `yaml:"server"`
	// Servers are the control addresses of several edges serving the same
	// pools (a cluster), "host:port" each, tried in order (see
	// tunnel.DialServers): the connector attaches to the first that answers
	// and moves to the next when its edge is lost. Exactly one of Server and
	// Servers is set.
	Servers []string `yaml:"servers"`
	// Transport is how the connector reaches its edges (transport): TransportTCP ("tcp",
	// the default; "" means the same), TransportWebSocket ("websocket": Server and
	// Servers are ws:// or wss:// URLs, all with the same scheme and path) or
	// TransportQUIC ("quic": Server and Servers are the edges' QUIC UDP addresses,
	// host:port; TLS is always on, proxy_url is refused).
	Transport string `yaml:"transport"`
	// AuthToken is presented to the edge; empty for none.
	AuthToken string `yaml:"auth_token"`
	// TLS says how to reach the edge; TLS.Enabled is false for plain TCP.
	TLS ConnectorTLS `yaml:"tls"`
	// DrainTimeout bounds how long open streams may run when the connector
	// leaves (drain_timeout_secs). Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout_secs"`
	// ControlSocket is the path of the connector's control socket
	// (control_socket); empty means the default. Relative paths in a file
	// read by LoadConnector are relative to the directory of that file.
	ControlSocket string `yaml:"control_socket"`
	// DataReadBuffer fixes the receive buffer of the connector's data connections
	// (data_read_buffer, bytes; they carry the public connections of TCP tunnels): 0 (the
	// default) leaves it to the kernel. For long links; see tunnel.WithDataReadBuffer.
	DataReadBuffer int `yaml:"data_read_buffer"`
	// Hostname is the host name sent with each tunnel (hostname): the edge's status page
	// and admin API show it, with the tunnel's name, beside the member's id. Empty (the
	// default) sends the machine's name (see tunnel.WithHostname). At most 253 letters,
	// digits, '.', '-' or '_'.
	Hostname string `yaml:"hostname"`
	// ProxyURL is the proxy the connector reaches its edges through (proxy_url; not with
	// transport quic, whose UDP no proxy carries, and which reads no proxy variable):
	// "http://[user:password@]host[:port]" (CONNECT), https:// (CONNECT over TLS to the
	// proxy), socks5:// or socks5h:// (SOCKS5; the proxy resolves the edge's name with
	// either). Empty: the environment's HTTPS_PROXY, ALL_PROXY and NO_PROXY decide, as for
	// tunnel.Dial (see tunnel.WithProxy).
	ProxyURL string `yaml:"proxy_url"`
	// Tunnels are the tunnels to register, in the order of the file.
	// There is at least one.
	Tunnels []Tunnel `yaml:"tunnels"`
}

// ConnectorTLS is the tls mapping of config.yml.
type ConnectorTLS struct {
	// Enabled turns TLS on. It defaults to true when the tls mapping is
	// present and to false when it is absent.
	Enabled bool `yaml:"enabled"`
	// CAPath is a PEM bundle that verifies the edge; empty means the system
	// roots. Relative paths in a file read by LoadConnector are relative to the
	// directory of that file.
	CAPath string `yaml:"ca_path"`
	// ServerName is the name verified in the edge's certificate. Parsing
	// sets it to the host part of Server when TLS is enabled and it is not
	// given. With Servers it stays empty unless given: each edge is then
	// verified by the host part of its own address.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify turns certificate verification off. Only an
	// explicit "true" in the file sets it.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Tunnel is one entry of the tunnels mapping of config.yml.
type Tunnel struct {
	// Name is the key of the entry, DNS-label-like (a-z, 0-9, "-").
	Name string `yaml:"-"`
	// Proto is group.ProtoHTTP, group.ProtoHTTPS, group.ProtoTCP or group.ProtoTLS
	// (TLS passthrough: reached on the edge's HTTPS port by the TLS server name
	// <subdomain>.<domain>; the local service terminates TLS itself).
	Proto group.Proto `yaml:"proto"`
	// LocalHost is the host of the local service. Default 127.0.0.1.
	LocalHost string `yaml:"local_host"`
	// LocalPort is the port of the local service, 1-65535.
	LocalPort int `yaml:"local_port"`
	// Subdomain is the public name <subdomain>.<domain>; set for http and
	// https tunnels, empty for tcp.
	Subdomain string `yaml:"subdomain"`
	// Group names the pool this tunnel joins; set together with GroupKey
	// or not at all.
	Group string `yaml:"group"`
	// GroupKey is the pool's shared secret.
	GroupKey string `yaml:"group_key"`
	// HealthCheck is the probe of the local service; nil for none (the
	// member is then always healthy).
	HealthCheck *HealthCheck `yaml:"health_check"`
	// Weight (1-100; 0 or absent: 1) is the member's share of new work
	// relative to the other members of its tier.
	Weight int `yaml:"weight"`
	// Priority is the member's tier (0, the default, is first): only the
	// lowest tier with a healthy member takes new work.
	Priority int `yaml:"priority"`
	// SlowStart ramps the member's share up over this long after it
	// turns healthy (slow_start_secs). Default 0: at once.
	SlowStart time.Duration `yaml:"slow_start_secs"`
	// Affinity is the pool's affinity: "cookie", "client_ip" or
	// "header:<Name>"; every member of a pool declares the same.
	Affinity string `yaml:"affinity"`
	// RetryIdempotent is the pool's opt-in idempotent retry; every member
	// of a pool declares the same.
	RetryIdempotent bool `yaml:"retry_idempotent"`
	// PreviousGroupKeys are the keys the pool had before group_key, during
	// a key rotation (at most 4).
	PreviousGroupKeys []string `yaml:"previous_group_keys"`
	// BackendProtocol is what the local service of an http or https tunnel
	// speaks: "http1" (the default; "" means the same) or "h2c",
	// HTTP/2 over cleartext with prior knowledge, which gRPC servers need.
	// It is this member's own setting: the members of a pool need not agree.
	BackendProtocol string `yaml:"backend_protocol"`
}

// defaultHealthCheck is a health_check mapping with the library's defaults.
func defaultHealthCheck() *HealthCheck {
	return &HealthCheck{Interval: health.DefaultInterval, Timeout: health.DefaultTimeout, MaxFailed: health.DefaultMaxFailed,
		Expect2xx: true}
}

// Spec is the tunnel's registration.
func (t Tunnel) Spec() tunnel.TunnelSpec {
	spec := tunnel.TunnelSpec{
		Proto:             t.Proto,
		Subdomain:         t.Subdomain,
		Group:             t.Group,
		GroupKey:          t.GroupKey,
		Weight:            t.Weight,
		Priority:          t.Priority,
		SlowStart:         t.SlowStart,
		Affinity:          t.Affinity,
		RetryIdempotent:   t.RetryIdempotent,
		PreviousGroupKeys: t.PreviousGroupKeys,
		BackendProtocol:   t.BackendProtocol,
	}
	spec.Name = t.Name // shown beside the member's id on the edge; a solo TCP tunnel's label
	if h := t.HealthCheck; h != nil {
		spec.Health = &health.Spec{
			Type:      health.Type(h.Type),
			Path:      h.Path,
			Interval:  h.Interval,
			Timeout:   h.Timeout,
			MaxFailed: h.MaxFailed,
			AnyStatus: !h.Expect2xx,
		}
		spec.AlertWebhook = h.AlertWebhook
	}
	return spec
}

// LocalAddr returns the local service's "host:port".
func (t Tunnel) LocalAddr() string {
	return net.JoinHostPort(t.LocalHost, strconv.Itoa(t.LocalPort))
}

// HealthCheck is the health_check mapping of a tunnel.
type HealthCheck struct {
	// Type is HealthTCP or HealthHTTP.
	Type string `yaml:"type"`
	// Path is the path to GET for HealthHTTP; it starts with "/". Empty
	// for HealthTCP.
	Path string `yaml:"path"`
	// Interval is the probe period (interval_secs). Default 10s.
	Interval time.Duration `yaml:"interval_secs"`
	// Timeout is the per-probe deadline (timeout_secs). Default 3s.
	Timeout time.Duration `yaml:"timeout_secs"`
	// MaxFailed is how many consecutive failures make the member
	// unhealthy. Default 3.
	MaxFailed int `yaml:"max_failed"`
	// Expect2xx makes an HTTP probe need a 2xx status; when false any
	// response counts. Default true.
	Expect2xx bool `yaml:"expect_2xx"`
	// AlertWebhook is the tenant URL the edge POSTs to when this tunnel's
	// group reaches zero healthy members; empty for none.
	AlertWebhook string `yaml:"alert_webhook"`
}

// DefaultConnectorPath returns the default location of the connector's
// configuration file, ~/.warren/config.yml.
func DefaultConnectorPath() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("config: cannot locate the default connector configuration: %w", err)
	}
	return filepath.Join(home, ".warren", "config.yml"), nil
}

// LoadConnector reads and parses the connector configuration file at path.
// A relative tls.ca_path in it is resolved against the directory of path.
// Errors are an [ErrorList] whose entries name path.
func LoadConnector(path string) (*Connector, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parseConnector(path, data, filepath.Dir(path))
}

// ParseConnector parses the YAML text of a connector configuration file,
// applies defaults and validates it. name is used in error messages
// (typically the file name). A relative tls.ca_path is taken relative to
// the working directory. On failure it returns an [ErrorList] holding every
// problem found (a syntax error stops parsing at that error), each naming
// the file, line and key.
func ParseConnector(name string, data []byte) (*Connector, error) {
	return parseConnector(name, data, "")
}

func parseConnector(file string, data []byte, dir string) (*Connector, error) {
	if err := sizeError(file, len(data)); err != nil {
		return nil, err
	}
	root, perr := parseYAML(file, data)
	if perr != nil {
		return nil, ErrorList{perr}
	}
	r := newReporter(file)
	cfg := &Connector{File: file, DrainTimeout: tunnel.DefaultDrainTimeout, Transport: TransportTCP}
	nested := r.yamlFields(root, "", cfg)
	if n := nested["tls"]; n != nil {
		cfg.TLS.Enabled = n.Kind == yaml.MappingNode
		r.yamlFields(n, "tls", &cfg.TLS)
		cfg.TLS.CAPath = resolvePath(dir, cfg.TLS.CAPath)
	}
	cfg.ControlSocket = resolvePath(dir, cfg.ControlSocket)
	cfg.Servers = r.yamlStrings(nested["servers"], "servers")
	tunnels, _ := r.yamlMapping(nested["tunnels"], "tunnels")
	for _, p := range tunnels {
		t := Tunnel{Name: p.key.Value, LocalHost: "127.0.0.1"}
		key := joinKey("tunnels", t.Name)
		r.lines[key] = p.key.Line
		nested := r.yamlFields(p.val, key, &t)
		if n := nested["health_check"]; n != nil {
			t.HealthCheck = defaultHealthCheck()
			r.yamlFields(n, joinKey(key, "health_check"), t.HealthCheck)
		}
		t.PreviousGroupKeys = r.yamlStrings(nested["previous_group_keys"], joinKey(key, "previous_group_keys"))
		cfg.Tunnels = append(cfg.Tunnels, t)
	}
	cfg.wsDefaults(nested["tls"] != nil)
	cfg.quicDefaults(nested["tls"] != nil)
	if cfg.TLS.Enabled && cfg.TLS.ServerName == "" && hostPortProblem(cfg.Server) == "" {
		cfg.TLS.ServerName, _, _ = net.SplitHostPort(cfg.Server)
	}
	cfg.validate(r)
	if err := r.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate checks every rule of config.yml on c, for a Connector built or
// changed in Go. It returns an [ErrorList] (with Line 0) or nil. It checks
// that tls.ca_path exists when TLS is enabled.
func (c *Connector) Validate() error {
	if c == nil {
		return ErrorList{{Msg: "no connector configuration", Err: ErrRequired}}
	}
	r := &reporter{file: c.File, bad: map[string]bool{}}
	c.validate(r)
	return r.err()
}

// Edges returns the edges the file names: Servers, or Server alone (host:port each, or URLs
// with transport websocket; DialOptions and DialAddrs turn those into what tunnel.Dial takes).
func (c *Connector) Edges() []string {
	if c.Servers != nil {
		return c.Servers
	}
	return []string{c.Server}
}

// DialAddrs are the addresses to give tunnel.Dial or tunnel.DialServers: Edges, with each
// websocket URL as its host:port (the port of its scheme when it has none).
func (c *Connector) DialAddrs() []string {
	addrs, _ := c.dialEdges()
	return addrs
}

// DialOptions are the options of a session with the edges the file names (DialAddrs): its
// transport (tunnel.WithWebSocket with the URLs' path for websocket), token, drain timeout,
// data connections' receive buffer, host name (when given), its proxy
// (proxy_url; none given: the environment's, tunnel.Dial's default) and, with TLS, the TLS
// settings (the CA bundle of tls.ca_path loaded). Add the program's own (tunnel.WithLogger).
// Its error names the file.
func (c *Connector) DialOptions() ([]tunnel.Option, error) {
	opts := []tunnel.Option{tunnel.WithToken(c.AuthToken), tunnel.WithDrainTimeout(c.DrainTimeout),
		tunnel.WithDataReadBuffer(c.DataReadBuffer)}
	_, ws := c.dialEdges()
	opts = append(opts, ws...)
	if c.Hostname != "" {
		opts = append(opts, tunnel.WithHostname(c.Hostname))
	}
	if c.ProxyURL != "" {
		u, err := url.Parse(c.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("%s: proxy_url is not a URL", c.File) // the URL may hold a password
		}
		opts = append(opts, tunnel.WithProxy(u))
	}
	if c.TLS.Enabled {
		tc, err := c.TLS.Config()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.File, err)
		}
		opts = append(opts, tunnel.WithTLS(tc))
	}
	return opts, nil
}

// Config is the TLS configuration of the connection to the edge: the system roots or the
// ca_path bundle (loaded here); verification is skipped only when the file says so.
func (t ConnectorTLS) Config() (*tls.Config, error) {
	tc := &tls.Config{
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, // only an explicit "true" in the file
		MinVersion:         tls.VersionTLS12,
	}
	if t.CAPath != "" {
		pem, err := os.ReadFile(t.CAPath)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_path: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_path: %s holds no PEM certificate", t.CAPath)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

func (c *Connector) validate(r *reporter) {
	switch {
	case c.Servers != nil:
		c.validateServers(r)
	case r.bad["servers"]: // not a list: reported already
	case c.Server == "" && r.missing("server"):
		r.add("server", ErrRequired, "required: the edge's control address as host:port, e.g. \"tunnel.example.com:4040\" (or servers: a list of several edges)")
	case c.Server == "":
		r.add("server", ErrRequired, "must not be empty: the edge's control address as host:port, e.g. \"tunnel.example.com:4040\"")
	default:
		r.invalid("server", c.edgeProblem(c.Server))
	}
	c.validateTransport(r)

	if c.TLS.Enabled {
		r.invalid("tls.ca_path", checkFile(c.TLS.CAPath))
		if c.TLS.CAPath != "" && c.TLS.InsecureSkipVerify {
			r.add("tls.insecure_skip_verify", ErrInvalid, "cannot be combined with tls.ca_path: the CA bundle would be ignored")
		}
		if c.TLS.ServerName != "" {
			r.invalid("tls.server_name", hostProblem(c.TLS.ServerName))
		}
	}
	r.invalid("control_socket", controlSocketProblem(c.ControlSocket))
	if c.DrainTimeout <= 0 {
		r.add("drain_timeout_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(c.DrainTimeout))
	}
	if c.DataReadBuffer < 0 || c.DataReadBuffer > MaxDataReadBuffer {
		r.add("data_read_buffer", ErrInvalid, "must be 0 (the kernel's autotuning) to %d bytes, got %d", MaxDataReadBuffer, c.DataReadBuffer)
	}
	if c.ProxyURL != "" {
		r.invalid("proxy_url", proxyURLProblem(c.ProxyURL))
	}

	if c.Hostname != "" && c.Hostname != wire.CleanDisplay(c.Hostname, wire.MaxHostLen) {
		r.add("hostname", ErrInvalid, "%q: use at most %d letters, digits, '.', '-' or '_' (the edge shows it beside the tunnels' members)",
			c.Hostname, wire.MaxHostLen)
	}
	if len(c.Tunnels) == 0 {
		r.add("tunnels", ErrRequired, "required: at least one tunnel, e.g. \"tunnels: {web: {proto: http, local_port: 3000, subdomain: web}}\"")
	}
	names := map[string]bool{}
	for _, t := range c.Tunnels {
		base := joinKey("tunnels", t.Name)
		if names[t.Name] {
			r.add(base, ErrInvalid, "duplicate tunnel name")
			continue
		}
		names[t.Name] = true
		t.validate(r, base)
	}
	validateSharing(r, c.Tunnels)
}

// validateServers checks the servers list: set instead of server, not
// empty, each entry a distinct host:port.
func (c *Connector) validateServers(r *reporter) {
	if _, given := r.lines["server"]; c.Server != "" || given {
		r.add("servers", ErrInvalid, "cannot be combined with server%s: give one edge as server or several as servers", r.lineNote("server"))
		return
	}
	if len(c.Servers) == 0 {
		r.add("servers", ErrInvalid, "must list at least one edge's control address as host:port, e.g. [\"a.example.com:4040\", \"b.example.com:4040\"]")
		return
	}
	seen := map[string]int{}
	for i, s := range c.Servers {
		key := indexKey("servers", i)
		if j, dup := seen[s]; dup {
			r.add(key, ErrInvalid, "%q is listed twice (also %s)", s, indexKey("servers", j))
			continue
		}
		seen[s] = i
		r.invalid(key, c.edgeProblem(s))
	}
}

func (t *Tunnel) validate(r *reporter, base string) {
	if p := group.SubdomainProblem(t.Name); p != "" {
		r.add(base, ErrInvalid, "tunnel name %s (names are DNS-label-like: a-z, 0-9 and \"-\")", p)
	}
	key := func(name string) string { return joinKey(base, name) }

	// The file's own rules: the keys it requires (the library takes http for no protocol),
	// the local service, a subdomain's characters (the edge's rule, group.ValidateSubdomain),
	// and the health check's keys.
	switch {
	case t.Proto == "" && r.missing(key("proto")):
		r.fail(key("proto"), ErrRequired, "required: http, https, tcp or tls")
	case t.Proto == "":
		r.fail(key("proto"), ErrInvalid, "must not be empty: use http, https, tcp or tls")
	}
	switch {
	case t.LocalPort == 0 && r.missing(key("local_port")):
		r.add(key("local_port"), ErrRequired, "required: the port of the local service (1-65535)")
	case t.LocalPort < 1 || t.LocalPort > 65535:
		r.add(key("local_port"), ErrInvalid, "%d is out of range 1-65535", t.LocalPort)
	}
	r.invalid(key("local_host"), hostProblem(t.LocalHost))
	switch {
	case t.Proto == group.ProtoTCP && t.Subdomain != "":
		r.fail(key("subdomain"), ErrInvalid, "not allowed when proto is \"tcp\": TCP tunnels are reached by port, not by host name")
	case t.Subdomain != "":
		if p := group.SubdomainProblem(t.Subdomain); p != "" {
			r.fail(key("subdomain"), ErrInvalid, "%s (a subdomain is one DNS label: a-z, 0-9 and \"-\")", p)
		}
	}
	if t.HealthCheck != nil {
		t.HealthCheck.validate(r, key("health_check"))
	}
	if t.GroupKey != "" && slices.Contains(t.PreviousGroupKeys, t.GroupKey) {
		r.fail(key("previous_group_keys"), ErrInvalid, "must not hold group_key itself")
	}
	// The library's rules of a registration (tunnel.TunnelSpec.Validate); what they need
	// depends on the protocol, so a tunnel without one is not checked further.
	if t.Proto != "" {
		r.library(t.Spec().Validate(), tunnelKey(base))
	}
}

// validate checks the health_check keys as the file writes them: a type of tcp or http, a
// path where it needs one (health.PathProblem), durations and counts greater than 0 (the
// library would take 0 as its default), an alert URL. Each problem fails its key, so that
// the library's check of the same probe (health.Spec.Validate) says nothing more.
func (h *HealthCheck) validate(r *reporter, base string) {
	key := func(name string) string { return joinKey(base, name) }
	switch h.Type {
	case HealthTCP:
		if h.Path != "" {
			r.fail(key("path"), ErrInvalid, "not allowed when type is \"tcp\"")
		}
	case HealthHTTP:
		if h.Path == "" {
			r.fail(key("path"), ErrRequired, "required when type is \"http\"")
		} else if p := health.PathProblem(h.Path); p != "" {
			r.fail(key("path"), ErrInvalid, "%s", p)
		}
	case "":
		if r.missing(key("type")) {
			r.fail(key("type"), ErrRequired, "required: tcp or http")
		} else {
			r.fail(key("type"), ErrInvalid, "must not be empty: use tcp or http")
		}
	default:
		r.fail(key("type"), ErrInvalid, "%q is not a health check type; use tcp or http", h.Type)
	}
	if h.Interval <= 0 {
		r.fail(key("interval_secs"), ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(h.Interval))
	}
	if h.Timeout <= 0 {
		r.fail(key("timeout_secs"), ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(h.Timeout))
	}
	if h.MaxFailed < 1 {
		r.fail(key("max_failed"), ErrInvalid, "must be at least 1, got %d", h.MaxFailed)
	}
	if p := webhookProblem(h.AlertWebhook); p != "" {
		r.fail(key("alert_webhook"), ErrInvalid, "%s", p)
	}
}

// validateSharing checks tunnels of one file that would land in the same
// pool: HTTP(S) tunnels sharing a subdomain must all carry the same
// group_key and protocol, and TCP tunnels sharing a group name the same
// group_key. The edge would reject the later registration otherwise.
// Messages name keys, never the secret values.
func validateSharing(r *reporter, tunnels []Tunnel) {
	bySubdomain := map[string]int{}
	for i, t := range tunnels {
		base := joinKey("tunnels", t.Name)
		switch {
		case t.Proto.BySubdomain() && t.Subdomain != "":
			j, seen := bySubdomain[t.Subdomain]
			if !seen {
				bySubdomain[t.Subdomain] = i
				continue
			}
			first := joinKey("tunnels", tunnels[j].Name)
			switch f := tunnels[j]; {
			case t.GroupKey == "" || f.GroupKey == "":
				r.add(joinKey(base, "subdomain"), ErrInvalid,
					"%q is already used by %s%s; tunnels may share a subdomain only as members of one group (give both the same group and group_key)",
					t.Subdomain, first, r.lineNote(first))
			case t.GroupKey != f.GroupKey:
				r.add(joinKey(base, "group_key"), ErrInvalid,
					"differs from the group_key of %s%s, which has the same subdomain %q; members of one pool must share one key",
					first, r.lineNote(first), t.Subdomain)
			case t.Proto != f.Proto:
				r.add(joinKey(base, "proto"), ErrInvalid,
					"%q differs from %q of %s%s, which has the same subdomain %q; members of one group must use the same protocol",
					t.Proto, f.Proto, first, r.lineNote(first), t.Subdomain)
			}
		}
		// TCP tunnels of one group name with different keys are different pools, each on
		// its own public port, as they are when they come from different files.
	}
}
