package config

import (
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"
)

// Load-balancing strategies accepted by [LoadBalancing.Strategy].
const (
	// StrategyLeastStreams picks the healthy member with the fewest active
	// streams, rotating ties. It is the default.
	StrategyLeastStreams = "least_streams"
	// StrategyRandom picks a healthy member uniformly at random.
	StrategyRandom = "random"
)

// Server is the edge's configuration file (server.toml) after defaults have
// been applied. Each field mirrors one key of the file.
type Server struct {
	// File is the name the configuration was parsed from; it prefixes every
	// error that Validate returns.
	File string
	// Server is the [server] table: public names and listening ports.
	Server ServerSection
	// TLS is the [tls] table. Both paths are empty when TLS is off.
	TLS ServerTLS
	// Auth is the [auth] table: connector tokens, tenants, admin token.
	Auth Auth
	// Limits is the [limits] table.
	Limits Limits
	// LoadBalancing is the [load_balancing] table.
	LoadBalancing LoadBalancing
}

// ServerSection is the [server] table of server.toml.
type ServerSection struct {
	// Domain is the DNS suffix of public HTTP host names:
	// <subdomain>.<domain>. Required; a lowercase host name.
	Domain string `toml:"domain"`
	// Bind is the address every listener binds to (key bind, written as a
	// string). Default 0.0.0.0.
	Bind netip.Addr `toml:"-"`
	// HTTPPort is the public HTTP port; 0 turns it off. Default 8080.
	HTTPPort int `toml:"http_port"`
	// HTTPSPort is the public HTTPS port; 0 (the default) turns it off. A
	// non-zero port needs [tls].
	HTTPSPort int `toml:"https_port"`
	// ControlPort is the port connectors dial. Default 4040.
	ControlPort int `toml:"control_port"`
	// AdminPort serves /healthz, /metrics and /api; 0 turns it off.
	// Default 9090.
	AdminPort int `toml:"admin_port"`
	// RegionID names this edge in alerts and metrics. Default "local".
	RegionID string `toml:"region_id"`
}

// Addr returns the "host:port" to listen on for port on the Bind address,
// or "" when port is 0 (off).
func (s ServerSection) Addr(port int) string {
	if port == 0 {
		return ""
	}
	return net.JoinHostPort(s.Bind.String(), strconv.Itoa(port))
}

// ServerTLS is the [tls] table of server.toml: a certificate and its key,
// both PEM files. Relative paths in a file read by LoadServer are relative
// to the directory of that file.
type ServerTLS struct {
	CertPath string `toml:"cert_path"` // certificate chain (PEM)
	KeyPath  string `toml:"key_path"`  // private key (PEM)
}

// Enabled reports whether a certificate and key are configured.
func (t ServerTLS) Enabled() bool { return t.CertPath != "" && t.KeyPath != "" }

// Auth is the [auth] table of server.toml. Validation ensures that every
// token (connector, tenant and admin) is distinct.
type Auth struct {
	// RequireAuth makes connectors present a token. When true there is at
	// least one token or tenant. Default false.
	RequireAuth bool `toml:"require_auth"`
	// Tokens authenticate connectors that belong to no tenant.
	Tokens []string `toml:"tokens"`
	// AdminToken is the bearer token of the admin API; empty means none
	// (the edge then keeps the API open only when RequireAuth is false).
	AdminToken string `toml:"admin_token"`
	// Tenants are the [[auth.tenants]] entries, in file order.
	Tenants []Tenant `toml:"tenants"`
}

// Tenant is one [[auth.tenants]] entry: its token authenticates the
// tenant's connectors and its admin API calls.
type Tenant struct {
	Name  string `toml:"name"`  // unique, non-empty
	Token string `toml:"token"` // non-empty, distinct from every other token
}

// Limits is the [limits] table of server.toml.
type Limits struct {
	// TCPPortRange is where TCP tunnels get their public ports (key
	// tcp_port_range, written [low, high]). Default 20000-20100.
	TCPPortRange PortRange `toml:"-"`
	// MaxTunnelsPerSession caps registrations per connector. Default 16.
	MaxTunnelsPerSession int `toml:"max_tunnels_per_session"`
	// RequestBodyMaxBytes caps public request bodies; 0 (the default)
	// means unlimited.
	RequestBodyMaxBytes int64 `toml:"request_body_max_bytes"`
	// DrainTimeout is how long a leaving member's open streams may run
	// (drain_timeout_secs). Default 30s.
	DrainTimeout time.Duration `toml:"-"`
	// MaxConcurrentPerMember caps in-flight requests or connections per
	// member; 0 (the default) means unlimited.
	MaxConcurrentPerMember int `toml:"max_concurrent_per_member"`
}

// PortRange is an inclusive range of TCP ports, Low <= High.
type PortRange struct {
	Low  int // first port of the range, 1-65535
	High int // last port of the range, Low-65535
}

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port int) bool { return port >= r.Low && port <= r.High }

// LoadBalancing is the [load_balancing] table of server.toml.
type LoadBalancing struct {
	// Enabled is the kill switch: when false (the default) every
	// registration is a solo tunnel.
	Enabled bool `toml:"enabled"`
	// Strategy is StrategyLeastStreams (the default) or StrategyRandom.
	Strategy string `toml:"strategy"`
	// AlertWebhookURL is the operator URL POSTed to when a group reaches
	// zero healthy members; empty for none. An absolute http(s) URL.
	AlertWebhookURL string `toml:"alert_webhook_url"`
	// AllowPrivateAlertWebhooks permits alert URLs that point at private
	// or loopback addresses. Default false.
	AllowPrivateAlertWebhooks bool `toml:"allow_private_alert_webhooks"`
	// RetryUnreadRequests sends a bodyless request whose backend reset
	// its connection with it unread to one other member. Default false.
	RetryUnreadRequests bool `toml:"retry_unread_requests"`
}

// defaultServer returns a Server holding every default of server.toml.
func defaultServer(file string) *Server {
	return &Server{
		File: file,
		Server: ServerSection{
			Bind:        netip.IPv4Unspecified(),
			HTTPPort:    8080,
			ControlPort: 4040,
			AdminPort:   9090,
			RegionID:    "local",
		},
		Limits: Limits{
			TCPPortRange:         PortRange{Low: 20000, High: 20100},
			MaxTunnelsPerSession: 16,
			DrainTimeout:         30 * time.Second,
		},
		LoadBalancing: LoadBalancing{Strategy: StrategyLeastStreams},
	}
}

// LoadServer reads and parses the server configuration file at path.
// Relative TLS paths in it are resolved against the directory of path.
// Errors are an [ErrorList] whose entries name path.
func LoadServer(path string) (*Server, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parseServer(path, data, filepath.Dir(path))
}

// ParseServer parses the TOML text of a server configuration file, applies
// defaults and validates it. name is used in error messages (typically the
// file name). Relative TLS paths are taken relative to the working
// directory. On failure it returns an [ErrorList] holding every problem
// found (a syntax error stops parsing at that error), each naming the file,
// line and key.
func ParseServer(name string, data []byte) (*Server, error) {
	return parseServer(name, data, "")
}

func parseServer(file string, data []byte, dir string) (*Server, error) {
	if err := sizeError(file, len(data)); err != nil {
		return nil, err
	}
	r := newReporter(file)
	cfg := defaultServer(file)
	f := &serverFile{Auth: cfg.Auth, LoadBalancing: cfg.LoadBalancing}
	f.Server.ServerSection, f.Limits.Limits = cfg.Server, cfg.Limits
	if !decodeTOML(r, data, f) {
		return nil, r.err()
	}
	cfg.Server, cfg.TLS, cfg.Auth, cfg.Limits, cfg.LoadBalancing = f.Server.ServerSection, f.TLS, f.Auth, f.Limits.Limits, f.LoadBalancing
	if f.Server.Bind != nil {
		addr, err := netip.ParseAddr(*f.Server.Bind)
		if err != nil {
			r.fail("server.bind", ErrInvalid, "%q is not an IP address; use e.g. \"0.0.0.0\" (all interfaces) or \"127.0.0.1\"", *f.Server.Bind)
		}
		cfg.Server.Bind = addr
	}
	cfg.TLS.CertPath = resolvePath(dir, cfg.TLS.CertPath)
	cfg.TLS.KeyPath = resolvePath(dir, cfg.TLS.KeyPath)
	switch pr := f.Limits.TCPPortRange; {
	case pr == nil:
	case len(pr) != 2:
		r.fail("limits.tcp_port_range", ErrInvalid, "must be two ports [low, high], got %d values", len(pr))
	default:
		cfg.Limits.TCPPortRange = PortRange{Low: int(pr[0]), High: int(pr[1])}
	}
	if d := f.Limits.DrainTimeout; d != nil {
		r.duration("limits.drain_timeout_secs", float64(*d), &cfg.Limits.DrainTimeout)
	}
	cfg.validate(r)
	if err := r.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate checks every rule of server.toml on c, for a Server built or
// changed in Go. It returns an [ErrorList] (with Line 0) or nil. It checks
// that the TLS files exist.
func (c *Server) Validate() error {
	if c == nil {
		return ErrorList{{Msg: "no server configuration", Err: ErrRequired}}
	}
	r := &reporter{file: c.File, bad: map[string]bool{}}
	c.validate(r)
	return r.err()
}

func (c *Server) validate(r *reporter) {
	s := c.Server
	switch {
	case s.Domain == "" && r.missing("server.domain"):
		r.add("server.domain", ErrRequired, "required: the DNS name public host names end in (<subdomain>.<domain>), e.g. \"tunnel.example.com\"")
	case s.Domain == "":
		r.add("server.domain", ErrRequired, "must not be empty: it is the DNS name public host names end in (<subdomain>.<domain>)")
	default:
		r.invalid("server.domain", domainProblem(s.Domain))
	}
	if !s.Bind.IsValid() {
		r.add("server.bind", ErrInvalid, "must be an IP address, e.g. \"0.0.0.0\"")
	}

	pr := c.Limits.TCPPortRange
	rangeOK := pr.Low >= 1 && pr.High <= 65535 && pr.Low <= pr.High
	ports := []struct {
		key  string
		port int
		min  int
	}{
		{"server.http_port", s.HTTPPort, 0},
		{"server.https_port", s.HTTPSPort, 0},
		{"server.control_port", s.ControlPort, 1},
		{"server.admin_port", s.AdminPort, 0},
	}
	used := map[int]string{}
	for _, p := range ports {
		switch {
		case p.port < p.min || p.port > 65535:
			if p.min == 1 {
				r.add(p.key, ErrInvalid, "%d is out of range 1-65535 (connectors need a control port)", p.port)
			} else {
				r.add(p.key, ErrInvalid, "%d is out of range 0-65535 (0 turns the listener off)", p.port)
			}
		case p.port == 0:
		case used[p.port] != "":
			r.add(p.key, ErrInvalid, "port %d is already used by %s%s", p.port, used[p.port], r.lineNote(used[p.port]))
		case rangeOK && pr.Contains(p.port):
			r.add(p.key, ErrInvalid, "port %d lies inside limits.tcp_port_range %d-%d, which is reserved for TCP tunnels", p.port, pr.Low, pr.High)
		default:
			used[p.port] = p.key
		}
	}
	if s.HTTPSPort > 0 && !c.TLS.Enabled() {
		r.add("server.https_port", ErrInvalid, "port %d needs a [tls] table with cert_path and key_path", s.HTTPSPort)
	}
	if s.RegionID == "" {
		r.add("server.region_id", ErrInvalid, "must not be empty (leave it out for the default \"local\")")
	}

	c.validateTLS(r)
	c.validateAuth(r)

	l := c.Limits
	switch {
	case pr.Low < 1 || pr.Low > 65535:
		r.add("limits.tcp_port_range", ErrInvalid, "low port %d is out of range 1-65535", pr.Low)
	case pr.High < 1 || pr.High > 65535:
		r.add("limits.tcp_port_range", ErrInvalid, "high port %d is out of range 1-65535", pr.High)
	case pr.Low > pr.High:
		r.add("limits.tcp_port_range", ErrInvalid, "low port %d is above high port %d", pr.Low, pr.High)
	}
	if l.MaxTunnelsPerSession < 1 {
		r.add("limits.max_tunnels_per_session", ErrInvalid, "must be at least 1, got %d", l.MaxTunnelsPerSession)
	}
	if l.RequestBodyMaxBytes < 0 {
		r.add("limits.request_body_max_bytes", ErrInvalid, "must be 0 (unlimited) or more, got %d", l.RequestBodyMaxBytes)
	}
	if l.DrainTimeout <= 0 {
		r.add("limits.drain_timeout_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(l.DrainTimeout))
	}
	if l.MaxConcurrentPerMember < 0 {
		r.add("limits.max_concurrent_per_member", ErrInvalid, "must be 0 (unlimited) or more, got %d", l.MaxConcurrentPerMember)
	}

	lb := c.LoadBalancing
	if lb.Strategy != StrategyLeastStreams && lb.Strategy != StrategyRandom {
		r.add("load_balancing.strategy", ErrInvalid, "%q is not a strategy; use %q or %q", lb.Strategy, StrategyLeastStreams, StrategyRandom)
	}
	r.invalid("load_balancing.alert_webhook_url", webhookProblem(lb.AlertWebhookURL))
}

func (c *Server) validateTLS(r *reporter) {
	cert, key := c.TLS.CertPath, c.TLS.KeyPath
	switch {
	case cert != "" && key == "":
		r.add("tls.key_path", ErrRequired, "required when tls.cert_path is set (give both or neither)")
	case key != "" && cert == "":
		r.add("tls.cert_path", ErrRequired, "required when tls.key_path is set (give both or neither)")
	}
	r.invalid("tls.cert_path", checkFile(cert))
	r.invalid("tls.key_path", checkFile(key))
}

func (c *Server) validateAuth(r *reporter) {
	a := c.Auth
	if a.RequireAuth && len(a.Tokens) == 0 && len(a.Tenants) == 0 {
		r.add("auth.require_auth", ErrInvalid, "is true but neither auth.tokens nor auth.tenants holds a token, so no connector could authenticate")
	}
	// Token values are secrets: messages name the keys, never the values.
	owner := map[string]string{}
	claim := func(key, token string) {
		if prev, dup := owner[token]; dup {
			r.add(key, ErrInvalid, "the same token is already used by %s%s; every token must be distinct", prev, r.lineNote(prev))
			return
		}
		owner[token] = key
	}
	for i, tok := range a.Tokens {
		key := indexKey("auth.tokens", i)
		if tok == "" {
			r.add(key, ErrInvalid, "must not be empty")
			continue
		}
		claim(key, tok)
	}
	names := map[string]string{}
	for i, t := range a.Tenants {
		base := indexKey("auth.tenants", i)
		nameKey, tokenKey := joinKey(base, "name"), joinKey(base, "token")
		switch prev, dup := names[t.Name]; {
		case t.Name == "":
			r.add(nameKey, ErrRequired, "required: every tenant needs a non-empty name")
		case dup:
			r.add(nameKey, ErrInvalid, "tenant %q is already defined by %s%s", t.Name, prev, r.lineNote(prev))
		default:
			names[t.Name] = base
		}
		if t.Token == "" {
			r.add(tokenKey, ErrRequired, "required: every tenant needs a non-empty token")
		} else {
			claim(tokenKey, t.Token)
		}
	}
	if a.AdminToken != "" {
		claim("auth.admin_token", a.AdminToken)
	}
}
