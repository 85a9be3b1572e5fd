package config

import (
	"errors"
	"fmt"
	"github.com/warren-tunnel/warren/group"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Tunnel protocols accepted by [Tunnel.Proto].
const (
	ProtoHTTP  = string(group.ProtoHTTP)
	ProtoHTTPS = string(group.ProtoHTTPS)
	ProtoTCP   = string(group.ProtoTCP)
)

// Health check types accepted by [HealthCheck.Type].
const (
	// HealthTCP succeeds when a TCP connection to the local service opens.
	HealthTCP = "tcp"
	// HealthHTTP succeeds when a GET of Path answers (with a 2xx status
	// when Expect2xx).
	HealthHTTP = "http"
)

// Client is the connector's configuration file (config.yml) after defaults
// have been applied. Each field mirrors one key of the file.
type Client struct {
	// File is the name the configuration was parsed from; it prefixes every
	// error that Validate returns.
	File string
	// Server is the edge's control address, "host:port". Required.
	Server string
	// AuthToken is presented to the edge; empty for none.
	AuthToken string
	// TLS says how to reach the edge; TLS.Enabled is false for plain TCP.
	TLS ClientTLS
	// DrainTimeout bounds how long open streams may run when the connector
	// leaves (drain_timeout_secs). Default 30s.
	DrainTimeout time.Duration
	// Tunnels are the tunnels to register, in the order of the file.
	// There is at least one.
	Tunnels []Tunnel
}

// ClientTLS is the tls mapping of config.yml.
type ClientTLS struct {
	// Enabled turns TLS on. It defaults to true when the tls mapping is
	// present and to false when it is absent.
	Enabled bool
	// CAPath is a PEM bundle that verifies the edge; empty means the system
	// roots. Relative paths in a file read by LoadClient are relative to the
	// directory of that file.
	CAPath string
	// ServerName is the name verified in the edge's certificate. Parsing
	// sets it to the host part of Server when TLS is enabled and it is not
	// given.
	ServerName string
	// InsecureSkipVerify turns certificate verification off. Only an
	// explicit "true" in the file sets it.
	InsecureSkipVerify bool
}

// Tunnel is one entry of the tunnels mapping of config.yml.
type Tunnel struct {
	// Name is the key of the entry, DNS-label-like (a-z, 0-9, "-").
	Name string
	// Proto is ProtoHTTP, ProtoHTTPS or ProtoTCP.
	Proto string
	// LocalHost is the host of the local service. Default 127.0.0.1.
	LocalHost string
	// LocalPort is the port of the local service, 1-65535.
	LocalPort int
	// Subdomain is the public name <subdomain>.<domain>; set for http and
	// https tunnels, empty for tcp.
	Subdomain string
	// Group names the pool this tunnel joins; set together with GroupKey
	// or not at all.
	Group string
	// GroupKey is the pool's shared secret.
	GroupKey string
	// HealthCheck is the probe of the local service; nil for none (the
	// member is then always healthy).
	HealthCheck *HealthCheck
}

// LocalAddr returns the local service's "host:port".
func (t Tunnel) LocalAddr() string {
	return net.JoinHostPort(t.LocalHost, strconv.Itoa(t.LocalPort))
}

// HealthCheck is the health_check mapping of a tunnel.
type HealthCheck struct {
	// Type is HealthTCP or HealthHTTP.
	Type string
	// Path is the path to GET for HealthHTTP; it starts with "/". Empty
	// for HealthTCP.
	Path string
	// Interval is the probe period (interval_secs). Default 10s.
	Interval time.Duration
	// Timeout is the per-probe deadline (timeout_secs). Default 3s.
	Timeout time.Duration
	// MaxFailed is how many consecutive failures make the member
	// unhealthy. Default 3.
	MaxFailed int
	// Expect2xx makes an HTTP probe need a 2xx status; when false any
	// response counts. Default true.
	Expect2xx bool
	// AlertWebhook is the tenant URL the edge POSTs to when this tunnel's
	// group reaches zero healthy members; empty for none.
	AlertWebhook string
}

// Keys of each mapping of config.yml.
var (
	clientRootKeys   = []string{"server", "auth_token", "tls", "drain_timeout_secs", "tunnels"}
	clientTLSKeys    = []string{"enabled", "ca_path", "server_name", "insecure_skip_verify"}
	clientTunnelKeys = []string{"proto", "local_port", "local_host", "subdomain", "group", "group_key", "health_check"}
	clientHealthKeys = []string{"type", "path", "interval_secs", "timeout_secs", "max_failed", "expect_2xx", "alert_webhook"}
)

// DefaultClientPath returns the default location of the connector's
// configuration file, ~/.warren/config.yml.
func DefaultClientPath() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("config: cannot locate the default client configuration: %w", err)
	}
	return filepath.Join(home, ".warren", "config.yml"), nil
}

// LoadClient reads and parses the connector configuration file at path.
// A relative tls.ca_path in it is resolved against the directory of path.
// Errors are an [ErrorList] whose entries name path.
func LoadClient(path string) (*Client, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parseClient(path, data, filepath.Dir(path))
}

// ParseClient parses the YAML text of a connector configuration file,
// applies defaults and validates it. name is used in error messages
// (typically the file name). A relative tls.ca_path is taken relative to
// the working directory. On failure it returns an [ErrorList] holding every
// problem found (a syntax error stops parsing at that error), each naming
// the file, line and key.
func ParseClient(name string, data []byte) (*Client, error) {
	return parseClient(name, data, "")
}

func parseClient(file string, data []byte, dir string) (*Client, error) {
	if err := sizeError(file, len(data)); err != nil {
		return nil, err
	}
	r := newReporter(file, true)
	root, perr := parseYAML(file, data, &r.errs)
	if perr != nil {
		return nil, append(r.errs, perr).err()
	}
	cfg := &Client{File: file, DrainTimeout: 30 * time.Second}
	top := r.openTable("", root, clientRootKeys)
	top.str("server", &cfg.Server)
	top.str("auth_token", &cfg.AuthToken)

	tl := top.sub("tls", clientTLSKeys)
	cfg.TLS.Enabled = tl.found
	tl.boolean("enabled", &cfg.TLS.Enabled)
	if tl.str("ca_path", &cfg.TLS.CAPath) {
		cfg.TLS.CAPath = resolvePath(dir, cfg.TLS.CAPath)
	}
	tl.str("server_name", &cfg.TLS.ServerName)
	tl.boolean("insecure_skip_verify", &cfg.TLS.InsecureSkipVerify)
	top.seconds("drain_timeout_secs", &cfg.DrainTimeout)

	tunnels := top.sub("tunnels", nil)
	for _, f := range tunnels.order {
		base := joinKey("tunnels", f.name)
		t := r.openTable(base, f.val, clientTunnelKeys)
		tun := Tunnel{Name: f.name, LocalHost: "127.0.0.1"}
		t.str("proto", &tun.Proto)
		t.integer("local_port", &tun.LocalPort)
		t.str("local_host", &tun.LocalHost)
		t.str("subdomain", &tun.Subdomain)
		t.str("group", &tun.Group)
		t.str("group_key", &tun.GroupKey)
		if h := t.sub("health_check", clientHealthKeys); h.found {
			hc := &HealthCheck{Interval: 10 * time.Second, Timeout: 3 * time.Second, MaxFailed: 3, Expect2xx: true}
			h.str("type", &hc.Type)
			h.str("path", &hc.Path)
			h.seconds("interval_secs", &hc.Interval)
			h.seconds("timeout_secs", &hc.Timeout)
			h.integer("max_failed", &hc.MaxFailed)
			h.boolean("expect_2xx", &hc.Expect2xx)
			h.str("alert_webhook", &hc.AlertWebhook)
			tun.HealthCheck = hc
		}
		cfg.Tunnels = append(cfg.Tunnels, tun)
	}

	if cfg.TLS.Enabled && cfg.TLS.ServerName == "" && hostPortProblem(cfg.Server) == "" {
		cfg.TLS.ServerName, _, _ = net.SplitHostPort(cfg.Server)
	}

	cfg.validate(r)
	if err := r.errs.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate checks every rule of config.yml on c, for a Client built or
// changed in Go. It returns an [ErrorList] (with Line 0) or nil. It checks
// that tls.ca_path exists when TLS is enabled.
func (c *Client) Validate() error {
	if c == nil {
		return ErrorList{{Msg: "no client configuration", Err: ErrRequired}}
	}
	r := &reporter{file: c.File, yaml: true, bad: map[string]bool{}}
	c.validate(r)
	return r.errs.err()
}

func (c *Client) validate(r *reporter) {
	switch {
	case c.Server == "" && r.missing("server"):
		r.add("server", ErrRequired, "required: the edge's control address as host:port, e.g. \"tunnel.example.com:4040\"")
	case c.Server == "":
		r.add("server", ErrRequired, "must not be empty: the edge's control address as host:port, e.g. \"tunnel.example.com:4040\"")
	default:
		if p := hostPortProblem(c.Server); p != "" {
			r.add("server", ErrInvalid, "%s", p)
		}
	}

	if c.TLS.Enabled {
		if c.TLS.CAPath != "" {
			if p := checkFile(c.TLS.CAPath); p != "" {
				r.add("tls.ca_path", ErrInvalid, "%s", p)
			}
			if c.TLS.InsecureSkipVerify {
				r.add("tls.insecure_skip_verify", ErrInvalid, "cannot be combined with tls.ca_path: the CA bundle would be ignored")
			}
		}
		if c.TLS.ServerName != "" {
			if p := hostProblem(c.TLS.ServerName); p != "" {
				r.add("tls.server_name", ErrInvalid, "%s", p)
			}
		}
	}
	if c.DrainTimeout <= 0 {
		r.add("drain_timeout_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(c.DrainTimeout))
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

func (t *Tunnel) validate(r *reporter, base string) {
	if p := labelProblem(t.Name); p != "" {
		r.add(base, ErrInvalid, "tunnel name %s (names are DNS-label-like: a-z, 0-9 and \"-\")", p)
	}
	key := func(name string) string { return joinKey(base, name) }

	switch t.Proto {
	case ProtoHTTP, ProtoHTTPS, ProtoTCP:
	case "":
		if r.missing(key("proto")) {
			r.add(key("proto"), ErrRequired, "required: http, https or tcp")
		} else {
			r.add(key("proto"), ErrInvalid, "must not be empty: use http, https or tcp")
		}
	default:
		r.add(key("proto"), ErrInvalid, "%q is not a protocol; use http, https or tcp", t.Proto)
	}

	switch {
	case t.LocalPort == 0 && r.missing(key("local_port")):
		r.add(key("local_port"), ErrRequired, "required: the port of the local service (1-65535)")
	case t.LocalPort < 1 || t.LocalPort > 65535:
		r.add(key("local_port"), ErrInvalid, "%d is out of range 1-65535", t.LocalPort)
	}
	if p := hostProblem(t.LocalHost); p != "" {
		r.add(key("local_host"), ErrInvalid, "%s", p)
	}

	switch {
	case t.Proto == ProtoTCP && t.Subdomain != "":
		r.add(key("subdomain"), ErrInvalid, "not allowed when proto is \"tcp\": TCP tunnels are reached by port, not by host name")
	case (t.Proto == ProtoHTTP || t.Proto == ProtoHTTPS) && t.Subdomain == "":
		r.add(key("subdomain"), ErrRequired, "required when proto is %q: the public host name is <subdomain>.<domain>", t.Proto)
	case t.Subdomain != "":
		if p := labelProblem(t.Subdomain); p != "" {
			r.add(key("subdomain"), ErrInvalid, "%s (a subdomain is one DNS label: a-z, 0-9 and \"-\")", p)
		}
	}

	switch {
	case t.Group != "" && t.GroupKey == "":
		r.add(key("group_key"), ErrRequired, "required when group is set: members of a pool share this secret")
	case t.Group == "" && t.GroupKey != "":
		r.add(key("group"), ErrRequired, "required when group_key is set: it names the pool")
	}

	if t.HealthCheck != nil {
		t.HealthCheck.validate(r, key("health_check"))
	}
}

func (h *HealthCheck) validate(r *reporter, base string) {
	key := func(name string) string { return joinKey(base, name) }
	switch h.Type {
	case HealthTCP:
		if h.Path != "" {
			r.add(key("path"), ErrInvalid, "not allowed when type is \"tcp\"")
		}
	case HealthHTTP:
		if h.Path == "" {
			r.add(key("path"), ErrRequired, "required when type is \"http\"")
		} else if p := probePathProblem(h.Path); p != "" {
			r.add(key("path"), ErrInvalid, "%s", p)
		}
	case "":
		if r.missing(key("type")) {
			r.add(key("type"), ErrRequired, "required: tcp or http")
		} else {
			r.add(key("type"), ErrInvalid, "must not be empty: use tcp or http")
		}
	default:
		r.add(key("type"), ErrInvalid, "%q is not a health check type; use tcp or http", h.Type)
	}
	if h.Interval <= 0 {
		r.add(key("interval_secs"), ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(h.Interval))
	}
	if h.Timeout <= 0 {
		r.add(key("timeout_secs"), ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(h.Timeout))
	}
	if h.MaxFailed < 1 {
		r.add(key("max_failed"), ErrInvalid, "must be at least 1, got %d", h.MaxFailed)
	}
	if h.AlertWebhook != "" {
		if p := webhookProblem(h.AlertWebhook); p != "" {
			r.add(key("alert_webhook"), ErrInvalid, "%s", p)
		}
	}
}

// validateSharing checks tunnels of one file that would land in the same
// pool: HTTP(S) tunnels sharing a subdomain must all carry the same
// group_key and protocol, and TCP tunnels sharing a group name the same
// group_key. The edge would reject the later registration otherwise.
// Messages name keys, never the secret values.
func validateSharing(r *reporter, tunnels []Tunnel) {
	bySubdomain := map[string]int{}
	byGroup := map[string]int{}
	for i, t := range tunnels {
		base := joinKey("tunnels", t.Name)
		switch {
		case (t.Proto == ProtoHTTP || t.Proto == ProtoHTTPS) && t.Subdomain != "":
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
		case t.Proto == ProtoTCP && t.Group != "" && t.GroupKey != "":
			j, seen := byGroup[t.Group]
			if !seen {
				byGroup[t.Group] = i
				continue
			}
			if f := tunnels[j]; f.GroupKey != t.GroupKey {
				first := joinKey("tunnels", f.Name)
				r.add(joinKey(base, "group_key"), ErrInvalid,
					"differs from the group_key of %s%s, which is in the same TCP group %q; members of one pool must share one key",
					first, r.lineNote(first), t.Group)
			}
		}
	}
}

// hostPortProblem says why s is not "host:port", or returns "".
func hostPortProblem(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		reason := err.Error()
		var ae *net.AddrError
		if errors.As(err, &ae) {
			reason = ae.Err
		}
		return fmt.Sprintf("%q is not host:port (%s), e.g. \"tunnel.example.com:4040\"", s, reason)
	}
	if p := hostProblem(host); p != "" {
		return "host " + p
	}
	if _, err := parsePort(port); err != nil {
		return "port " + err.Error()
	}
	return ""
}

// probePathProblem says why p cannot be the path of an HTTP probe.
func probePathProblem(p string) string {
	if !strings.HasPrefix(p, "/") {
		return fmt.Sprintf("%q must start with \"/\"", p)
	}
	for _, r := range p {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Sprintf("%q must not contain spaces or control characters (escape them, e.g. %%20)", p)
		}
	}
	return ""
}
