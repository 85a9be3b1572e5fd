package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/cluster"
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
	// Endpoints are the [[endpoints]] entries, in file order: routes reserved for a
	// tenant, with their traffic policy.
	Endpoints []Endpoint
	// Cluster is the [cluster] table: this edge is one of several sharing their routes
	// and pools through NATS JetStream. Nil (no [cluster] table) is a single edge.
	Cluster *Cluster
}

// Cluster is the [cluster] table of server.toml: the edge is one of several that share
// their routes and pools through NATS JetStream and reach each other's members over
// authenticated edge-to-edge links (see tunnel.ClusterConfig). Every edge of a cluster
// names the same NATS servers, bucket and token.
type Cluster struct {
	// NATSURLs are the NATS servers ("nats://host:4222", "tls://host:4222"); the edge
	// fails over between them. Required, at least one.
	NATSURLs []string `toml:"nats_urls"`
	// EdgeID names this edge in member lists, /api/cluster and its lease: 1 to 64 of
	// A-Z, a-z, 0-9, "-" and "_". Empty (the default) means the host name.
	EdgeID string `toml:"edge_id"`
	// Advertise is the host:port the other edges dial to reach this edge. Required.
	Advertise string `toml:"advertise"`
	// PeerAddr is the address this edge listens on for the other edges ("host:port" or
	// ":port"). Default: PeerPort on [server] bind with PeerPort, else Advertise.
	PeerAddr string `toml:"peer_addr"`
	// PeerPort is the port this edge listens on for the other edges, on the [server] bind
	// address like every other *_port (peer_port = 7443 with bind = "127.0.0.2" is
	// peer_addr = "127.0.0.2:7443"). Give one of PeerAddr and PeerPort.
	PeerPort int `toml:"peer_port"`
	// Token authenticates the edges to each other; the same on every edge, at least
	// tunnel.MinTokenLength characters, distinct from every token of [auth]. Required.
	Token string `toml:"token"`
	// LeaseTTL is how long the edge's lease lasts without a renewal (lease_secs): the
	// members of an edge that dies leave every other edge's view within it. Default
	// cluster.DefaultLeaseTTL (10s), at least cluster.MinLeaseTTL.
	LeaseTTL time.Duration `toml:"-"`
	// Bucket prefixes the JetStream key-value buckets the edges share. Default
	// cluster.DefaultBucket ("warren").
	Bucket string `toml:"bucket"`
	// Replicas is the replica count of the buckets (3 with a 3-node NATS cluster).
	// Default 1, at most cluster.MaxReplicas.
	Replicas int `toml:"replicas"`
	// Timeout bounds each request to NATS (timeout_secs). Default cluster.DefaultTimeout
	// (5s).
	Timeout time.Duration `toml:"-"`
	// TLS is the [cluster.tls] table: TLS on the edge-to-edge links.
	TLS ClusterTLS `toml:"tls"`
}

// ClusterTLS is the [cluster.tls] table: with CertPath and KeyPath the edge-to-edge
// links use TLS, this edge presenting that certificate and verifying the other edges'
// with CAPath (empty: the system roots) against the host of their advertise address.
// Relative paths in a file read by LoadServer are relative to its directory.
type ClusterTLS struct {
	CertPath string `toml:"cert_path"` // this edge's certificate chain (PEM)
	KeyPath  string `toml:"key_path"`  // its private key (PEM)
	CAPath   string `toml:"ca_path"`   // PEM bundle verifying the other edges
}

// Enabled reports whether the edge-to-edge links use TLS.
func (t ClusterTLS) Enabled() bool { return t.CertPath != "" && t.KeyPath != "" }

// Endpoint is one [[endpoints]] entry: a route reserved for a tenant before any connector
// registers it, and the policy for its public traffic.
type Endpoint struct {
	// Subdomain reserves an HTTP(S) route; with Proto "tcp", Group and Port reserve a TCP
	// pool's name and public port.
	Subdomain string `toml:"subdomain"`
	// Proto is "http" (the default) or "tcp".
	Proto string `toml:"proto"`
	// Port is a TCP endpoint's public port, inside limits.tcp_port_range.
	Port int `toml:"port"`
	// Tenant owns the endpoint: a name from [[auth.tenants]], or "" for the connectors of
	// auth.tokens (and of an edge without authentication).
	Tenant string `toml:"tenant"`
	// Group is the pool's name; required.
	Group string `toml:"group"`
	// KeySHA256 is the hex SHA-256 of the group key (never the key); required for TCP.
	KeySHA256 string `toml:"key_sha256"`
	// AllowCIDRs, when not empty, are the only client addresses admitted; DenyCIDRs are
	// refused (deny wins).
	AllowCIDRs []string `toml:"allow_cidrs"`
	DenyCIDRs  []string `toml:"deny_cidrs"`
	// RateLimit is the requests (TCP: connections) per second per client IP; 0 means none.
	RateLimit float64 `toml:"rate_limit"`
	// RateBurst is the burst of RateLimit; 0 means RateLimit rounded up.
	RateBurst int `toml:"rate_burst"`
	// MaxConcurrent caps the endpoint's in-flight requests and connections; 0 means none.
	MaxConcurrent int `toml:"max_concurrent"`
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
	// QUICPort is the UDP port connectors reach the edge on over QUIC (transport: quic in
	// their file); 0 (the default) turns it off. It needs [tls]: QUIC is TLS 1.3, and the
	// edge presents the certificate TLS connectors verify on the control port. A UDP port:
	// it may have the number of a TCP port of the edge (control_port, say). The program
	// must link package tunnel/quic (the edge of examples/edge does). See
	// tunnel.ServerConfig.QUICAddr.
	QUICPort int `toml:"quic_port"`
	// AdminPort serves /healthz, /metrics and /api; 0 turns it off.
	// Default 9090.
	AdminPort int `toml:"admin_port"`
	// AdminBind is the address the admin listener binds to (key admin_bind, written as a
	// string). The zero value (the key left out) is the default: 127.0.0.1, or Bind when
	// that is a loopback address itself (see AdminHost). The admin plane answers on
	// loopback unless an address is given here.
	AdminBind netip.Addr `toml:"-"`
	// AllowOpenAdmin lets the admin listener serve on an address that is not loopback
	// without auth.admin_token; default false: such a file is refused.
	AllowOpenAdmin bool `toml:"allow_open_admin"`
	// AdminHosts are the host names the admin port is reached by, besides its IP
	// addresses and localhost: with neither an admin token nor tenants the admin API is
	// open, and answers no other name (admin.Options.Hosts). Default none.
	AdminHosts []string `toml:"admin_hosts"`
	// RegionID names this edge in alerts and metrics. Default "local".
	RegionID string `toml:"region_id"`
	// StateDir is where the edge keeps route ownership (an embedded database), so that it
	// survives restarts; "" (the default) keeps it in memory. Relative to the file's
	// directory.
	StateDir string `toml:"state_dir"`
	// H2C makes the public HTTP port serve HTTP/2 over cleartext with prior
	// knowledge too (gRPC clients without TLS); default false (such clients
	// are refused at once). The HTTPS port offers HTTP/2 by ALPN anyway.
	H2C bool `toml:"h2c"`
	// TrustedProxies are the CIDR prefixes of the proxies in front of the edge (a load
	// balancer, a CDN) whose forwarding headers it believes: from them X-Forwarded-For and
	// Forwarded are kept with the peer appended, and X-Real-IP is the right-most address
	// of the chain outside these prefixes. From any other peer the edge replaces them
	// with its own. Default none.
	TrustedProxies []string `toml:"trusted_proxies"`
	// DataReadBuffer fixes the receive buffer of the edge's side of data connections
	// (bytes; they carry TCP tunnels' public connections and receive their downloads): 0 (the
	// default) leaves it to the kernel. For long links to connectors; see
	// tunnel.ServerConfig.DataReadBuffer.
	DataReadBuffer int `toml:"data_read_buffer"`
	// WebSocketPath, e.g. "/_warren/connect", lets connectors reach the edge over a
	// WebSocket at this path of the public HTTPS port (transport: websocket in their file),
	// for connectors behind a proxy or CDN that passes only HTTPS; "" (the default): off.
	// The path is the edge's only on the bare domain (Host = domain): on a tunnel's
	// <subdomain>.<domain> the same path is the tunnel's. See
	// tunnel.PublicHTTP.WebSocketPath.
	WebSocketPath string `toml:"websocket_path"`
	// WebSocketOnHTTP serves websocket_path on the public HTTP port too, for an edge
	// behind a proxy that terminates TLS; default false (a token would cross in the clear).
	WebSocketOnHTTP bool `toml:"websocket_on_http"`
}

// Addr returns the "host:port" to listen on for port on the Bind address,
// or "" when port is 0 (off).
func (s ServerSection) Addr(port int) string {
	if port == 0 {
		return ""
	}
	return net.JoinHostPort(s.Bind.String(), strconv.Itoa(port))
}

// AdminHost is the address the admin listener binds to: AdminBind when set, else Bind
// when that is a loopback address, else 127.0.0.1.
func (s ServerSection) AdminHost() netip.Addr {
	switch {
	case s.AdminBind.IsValid():
		return s.AdminBind
	case s.Bind.IsLoopback():
		return s.Bind
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// AdminAddr returns the "host:port" of the admin listener (AdminHost and AdminPort), or ""
// when AdminPort is 0 (off).
func (s ServerSection) AdminAddr() string {
	if s.AdminPort == 0 {
		return ""
	}
	return net.JoinHostPort(s.AdminHost().String(), strconv.Itoa(s.AdminPort))
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
	// Quotas override the [limits] defaults for this tenant; 0 keeps the default.
	Quotas
}

// Quotas cap what one tenant may hold; 0 means no cap (in [limits]) or the [limits] value
// (in [[auth.tenants]]).
type Quotas struct {
	MaxSessions     int `toml:"max_sessions"`      // connector sessions
	MaxTunnels      int `toml:"max_tunnels"`       // registered tunnels over all sessions
	MaxTCPPorts     int `toml:"max_tcp_ports"`     // public TCP ports held for its pools
	MaxEventStreams int `toml:"max_event_streams"` // open live event streams on the admin API
	MaxRoutes       int `toml:"max_routes"`        // routes held: live, or until route_ttl_secs after their last member
}

// Limits is the [limits] table of server.toml.
type Limits struct {
	// Quotas are every tenant's default quotas. Defaults: 64 sessions, 1024 tunnels, 16
	// TCP ports, 8 event streams, 1024 routes.
	Quotas
	// RouteTTL is how long a route stays its owner's after its last member left
	// (route_ttl_secs). Default 24h.
	RouteTTL time.Duration `toml:"-"`
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
	// RequestBodyTimeout is how long a public request body may take to
	// arrive (request_body_timeout_secs); 0 means no limit. Default 60s.
	RequestBodyTimeout time.Duration `toml:"-"`
	// RequestBodyMinRate is the slowest average rate, in bytes per second,
	// at which a public request body may arrive once
	// RequestBodyMinRateGrace has passed; 0 means no minimum. Default 1024.
	RequestBodyMinRate int64 `toml:"request_body_min_rate"`
	// RequestBodyMinRateGrace is how long a request body may take before
	// the minimum rate applies (request_body_min_rate_grace_secs).
	// Default 10s.
	RequestBodyMinRateGrace time.Duration `toml:"-"`
	// ResponseStallTimeout cuts a response whose write to its public client
	// has made no progress for this long (response_stall_timeout_secs); 0
	// means no limit. Default 60s.
	ResponseStallTimeout time.Duration `toml:"-"`
	// MaxStalledResponseBytes, MaxStalledResponseBytesPerConn and
	// MaxStalledResponseBytesPerIP bound what the responses whose public
	// client is not keeping up may hold at the edge: in all, per public
	// connection and per client address (an IPv4 address or an IPv6 /64).
	// A response over one is cut at once; 0 means no bound. Defaults 256 MiB,
	// 16 MiB and 32 MiB.
	MaxStalledResponseBytes        int64 `toml:"max_stalled_response_bytes"`
	MaxStalledResponseBytesPerConn int64 `toml:"max_stalled_response_bytes_per_conn"`
	MaxStalledResponseBytesPerIP   int64 `toml:"max_stalled_response_bytes_per_ip"`
	// MaxPreAuthConns caps the control connections not yet authenticated,
	// in all; MaxPreAuthConnsPerIP those from one source address (an IPv4
	// address or an IPv6 /64), at most MaxPreAuthConns. A connection over
	// either cap is closed at once. Defaults 256 and 16.
	MaxPreAuthConns      int `toml:"max_preauth_conns"`
	MaxPreAuthConnsPerIP int `toml:"max_preauth_conns_per_ip"`
	// HelloTimeout is how long a new control connection has, from its
	// accept, to say hello (hello_timeout_secs). Default 5s, at most 30s.
	HelloTimeout time.Duration `toml:"-"`
	// MaxAuthFailuresPerIP failed authentications from one source address
	// within AuthFailureWindow (auth_failure_window_secs), on the control
	// and admin listeners together, block it for AuthBlock
	// (auth_block_secs). Defaults 10, 600s and 900s.
	MaxAuthFailuresPerIP int           `toml:"max_auth_failures_per_ip"`
	AuthFailureWindow    time.Duration `toml:"-"`
	AuthBlock            time.Duration `toml:"-"`
}

// MaxHelloTimeout is the longest limits.hello_timeout_secs: a connection
// waiting for its hello holds a file descriptor and a place under
// limits.max_preauth_conns.
const MaxHelloTimeout = 30 * time.Second

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
	// Strategy is dispatch.NameLeastStreams (the default) or dispatch.NameRandom.
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
	// RetryIdempotent sends an idempotent request (GET, HEAD, OPTIONS,
	// PUT, DELETE, or one with an Idempotency-Key header; body at most
	// 64 KiB) whose member failed before answering to one other member,
	// in every pool. Default false (a pool may still ask for it).
	RetryIdempotent bool `toml:"retry_idempotent"`
	// OutlierEjection ejects a member whose streams fail 5 times in a row
	// within 10 s for 30 s (doubling up to 5 min while it keeps failing),
	// never more than half of a pool. Default false.
	OutlierEjection bool `toml:"outlier_ejection"`
	// PreferLocalStreams, in a cluster, lets the members attached to this edge take a
	// pool's new work while they are less than this many active streams ahead of the
	// pool's members on other edges (1: ties go local). Default 0: ties rotate over the
	// whole pool, as on one edge (tunnel.LoadBalancing.PreferLocalStreams).
	PreferLocalStreams int `toml:"prefer_local_streams"`
	// AlertMinInterval, when above 0, is the shortest time between two
	// alerts of one group (alert_min_interval_secs); what happens inside it
	// is reported when it ends. Default 0: off, every fall to zero healthy
	// members alerts at once (the alert document's rule).
	AlertMinInterval time.Duration `toml:"-"`
	// AlertOnRecovery also POSTs a group_recovered alert when a group that
	// fell has a healthy member again. Default false: the alert document's
	// only event is group_zero_healthy.
	AlertOnRecovery bool `toml:"alert_on_recovery"`
}

// The file's own defaults, for settings the library leaves off or to the embedder.
var (
	defaultHTTPPort     = 8080
	defaultAdminPort    = 9090
	defaultTCPPortRange = PortRange{Low: 20000, High: 20100}
	// defaultQuotas are every tenant's quotas; the library caps nothing by default.
	defaultQuotas = Quotas{MaxSessions: 64, MaxTunnels: 1024, MaxTCPPorts: 16, MaxEventStreams: 8, MaxRoutes: 1024}
)

// defaultServer returns a Server holding every default of server.toml: the library's own
// (tunnel.ServerConfig.WithDefaults), and the file's for what the library leaves off.
func defaultServer(file string) *Server {
	d := tunnel.ServerConfig{}.WithDefaults()
	return &Server{
		File: file,
		Server: ServerSection{
			Bind:        netip.IPv4Unspecified(),
			HTTPPort:    defaultHTTPPort,
			ControlPort: tunnel.DefaultControlPort,
			AdminPort:   defaultAdminPort,
			RegionID:    d.RegionID,
		},
		Limits: Limits{
			Quotas:               defaultQuotas,
			RouteTTL:             d.RouteTTL,
			TCPPortRange:         defaultTCPPortRange,
			MaxTunnelsPerSession: d.Limits.MaxTunnelsPerSession,
			DrainTimeout:         d.Timeouts.Drain,

			RequestBodyTimeout:      d.RequestBody.Timeout,
			RequestBodyMinRate:      d.RequestBody.MinRate,
			RequestBodyMinRateGrace: d.RequestBody.MinRateGrace,

			ResponseStallTimeout:           d.StalledResponses.Timeout,
			MaxStalledResponseBytes:        d.StalledResponses.MaxBytes,
			MaxStalledResponseBytesPerConn: d.StalledResponses.MaxBytesPerConn,
			MaxStalledResponseBytesPerIP:   d.StalledResponses.MaxBytesPerIP,

			MaxPreAuthConns:      d.PreAuth.MaxConns,
			MaxPreAuthConnsPerIP: d.PreAuth.MaxConnsPerIP,
			HelloTimeout:         d.PreAuth.HelloTimeout,
			MaxAuthFailuresPerIP: d.PreAuth.MaxAuthFailuresPerIP,
			AuthFailureWindow:    d.PreAuth.AuthFailureWindow,
			AuthBlock:            d.PreAuth.AuthBlockDuration,
		},
		LoadBalancing: LoadBalancing{Strategy: d.LoadBalancing.Strategy, AlertMinInterval: d.Alerts.MinInterval},
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
	f := &serverFile{Auth: cfg.Auth}
	f.LoadBalancing.LoadBalancing = cfg.LoadBalancing
	f.Server.ServerSection, f.Limits.Limits = cfg.Server, cfg.Limits
	if !decodeTOML(r, data, f) {
		return nil, r.err()
	}
	cfg.Server, cfg.TLS, cfg.Auth, cfg.Limits, cfg.LoadBalancing = f.Server.ServerSection, f.TLS, f.Auth, f.Limits.Limits, f.LoadBalancing.LoadBalancing
	cfg.Endpoints = f.Endpoints
	if f.Cluster != nil {
		cfg.Cluster = decodeCluster(r, f.Cluster, dir)
	}
	cfg.Server.StateDir = resolvePath(dir, cfg.Server.StateDir)
	if f.Server.Bind != nil {
		addr, err := netip.ParseAddr(*f.Server.Bind)
		if err != nil {
			r.fail("server.bind", ErrInvalid, "%q is not an IP address; use e.g. \"0.0.0.0\" (all interfaces) or \"127.0.0.1\"", *f.Server.Bind)
		}
		cfg.Server.Bind = addr
	}
	cfg.Server.AdminBind = parseAdminBind(r, f.Server.AdminBind)
	if cl := cfg.Cluster; cl != nil && cl.PeerAddr == "" && cl.PeerPort != 0 {
		cl.PeerAddr = cfg.Server.Addr(cl.PeerPort) // like every other *_port, on [server] bind
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
	readDurations(r, f, cfg)
	cfg.validate(r)
	if err := r.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// decodeCluster returns the [cluster] table read from cf, with the library's defaults for
// what it leaves out and its paths taken relative to dir. A peer_port's address is set by
// the caller, once [server] bind is read.
func decodeCluster(r *reporter, cf *clusterFile, dir string) *Cluster {
	cl := cf.Cluster
	cl.LeaseTTL, cl.Timeout = cluster.DefaultLeaseTTL, cluster.DefaultTimeout
	if r.missing("cluster.bucket") {
		cl.Bucket = cluster.DefaultBucket
	}
	if r.missing("cluster.replicas") {
		cl.Replicas = cluster.DefaultReplicas
	}
	if d := cf.LeaseTTL; d != nil {
		r.duration("cluster.lease_secs", float64(*d), &cl.LeaseTTL)
	}
	if d := cf.Timeout; d != nil {
		r.duration("cluster.timeout_secs", float64(*d), &cl.Timeout)
	}
	if cl.PeerPort == 0 && !r.missing("cluster.peer_port") {
		r.add("cluster.peer_port", ErrInvalid, "port 0 is out of range 1-65535")
	}
	if cl.PeerAddr == "" && cl.PeerPort == 0 {
		cl.PeerAddr = cl.Advertise
	} // with peer_port, on the bind address: set below, once bind is read
	cl.TLS.CertPath = resolvePath(dir, cl.TLS.CertPath)
	cl.TLS.KeyPath = resolvePath(dir, cl.TLS.KeyPath)
	cl.TLS.CAPath = resolvePath(dir, cl.TLS.CAPath)
	return &cl
}

// readDurations sets the durations of [limits] and [load_balancing], given in seconds, on cfg.
func readDurations(r *reporter, f *serverFile, cfg *Server) {
	if d := f.Limits.RouteTTL; d != nil {
		r.duration("limits.route_ttl_secs", float64(*d), &cfg.Limits.RouteTTL)
	}
	if d := f.Limits.DrainTimeout; d != nil {
		r.duration("limits.drain_timeout_secs", float64(*d), &cfg.Limits.DrainTimeout)
	}
	if d := f.LoadBalancing.AlertMinInterval; d != nil {
		r.duration("load_balancing.alert_min_interval_secs", float64(*d), &cfg.LoadBalancing.AlertMinInterval)
	}
	if d := f.Limits.RequestBodyTimeout; d != nil {
		r.duration("limits.request_body_timeout_secs", float64(*d), &cfg.Limits.RequestBodyTimeout)
	}
	if d := f.Limits.RequestBodyMinRateGrace; d != nil {
		r.duration("limits.request_body_min_rate_grace_secs", float64(*d), &cfg.Limits.RequestBodyMinRateGrace)
	}
	if d := f.Limits.ResponseStallTimeout; d != nil {
		r.duration("limits.response_stall_timeout_secs", float64(*d), &cfg.Limits.ResponseStallTimeout)
	}
	if d := f.Limits.HelloTimeout; d != nil {
		r.duration("limits.hello_timeout_secs", float64(*d), &cfg.Limits.HelloTimeout)
	}
	if d := f.Limits.AuthFailureWindow; d != nil {
		r.duration("limits.auth_failure_window_secs", float64(*d), &cfg.Limits.AuthFailureWindow)
	}
	if d := f.Limits.AuthBlock; d != nil {
		r.duration("limits.auth_block_secs", float64(*d), &cfg.Limits.AuthBlock)
	}
}

// parseAdminBind reads admin_bind (nil: not set, the zero Addr: the default).
func parseAdminBind(r *reporter, v *string) netip.Addr {
	if v == nil {
		return netip.Addr{}
	}
	addr, err := netip.ParseAddr(*v)
	if err != nil {
		r.fail("server.admin_bind", ErrInvalid, "%q is not an IP address; use e.g. \"127.0.0.1\" (this machine only, the default) or \"0.0.0.0\" (all interfaces)", *v)
	}
	return addr
}

// validateAdmin refuses an admin listener off loopback without an admin token, unless
// allow_open_admin says it is meant.
func (c *Server) validateAdmin(r *reporter) {
	s := c.Server
	if s.AdminPort == 0 || s.AllowOpenAdmin || c.Auth.AdminToken != "" || s.AdminHost().IsLoopback() {
		return
	}
	r.add("server.admin_bind", ErrInvalid, "the admin listener would serve %s, which is not a loopback address, without an admin token: "+
		"set auth.admin_token (at least 16 characters), or admin_bind = \"127.0.0.1\", or allow_open_admin = true to serve it there without one",
		s.AdminAddr())
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
	c.validateServerSection(r)
	c.validatePorts(r)
	c.validateTLS(r)
	c.validateAuth(r)
	c.validateCluster(r)
	c.validateLimits(r)
	c.validateEndpoints(r)
	c.validateLoadBalancing(r)
}

// validateServerSection checks the [server] table but for its ports.
func (c *Server) validateServerSection(r *reporter) {
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
	c.validateAdmin(r)
	for i, h := range s.AdminHosts {
		if _, err := netip.ParseAddr(h); err == nil {
			r.add(indexKey("server.admin_hosts", i), ErrInvalid, "%q is an IP address: addresses are always answered; list host names", h)
			continue
		}
		r.invalid(indexKey("server.admin_hosts", i), hostProblem(h))
	}
	for i, p := range s.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			hint := ""
			if a, err := netip.ParseAddr(p); err == nil {
				hint = fmt.Sprintf("; for this one address write \"%s/%d\"", a.WithZone(""), a.BitLen())
			}
			r.add(indexKey("server.trusted_proxies", i), ErrInvalid, "%q is not a CIDR prefix such as \"10.0.0.0/8\"%s", p, hint)
		}
	}

}

// validatePorts checks the listeners' ports: in range, distinct, outside the TCP tunnels'
// range; and the [server] settings read with them.
func (c *Server) validatePorts(r *reporter) {
	s := c.Server
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
	c.validateQUICPort(r)
	switch {
	case s.WebSocketOnHTTP && s.HTTPPort == 0:
		r.add("server.websocket_on_http", ErrInvalid, "serves websocket_path on the public HTTP port: set server.http_port")
	case s.WebSocketPath != "" && s.HTTPSPort == 0 && !s.WebSocketOnHTTP:
		r.add("server.websocket_path", ErrInvalid, "is served on the public HTTPS port: set server.https_port (with [tls]), or websocket_on_http = true behind a proxy that terminates TLS")
	}
	if s.RegionID == "" {
		r.add("server.region_id", ErrInvalid, "must not be empty (leave it out for the default \"local\")")
	}
	if s.DataReadBuffer < 0 || s.DataReadBuffer > MaxDataReadBuffer {
		r.add("server.data_read_buffer", ErrInvalid, "must be 0 (the kernel's autotuning) to %d bytes, got %d", MaxDataReadBuffer, s.DataReadBuffer)
	}

}

// validateLimits checks the [limits] table but for its endpoints.
func (c *Server) validateLimits(r *reporter) {
	pr := c.Limits.TCPPortRange
	l := c.Limits
	if pr == (PortRange{}) { // the library's "no TCP tunnels", which the file writes by leaving them out
		r.add("limits.tcp_port_range", ErrInvalid, "low port 0 is out of range 1-65535")
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
	if l.RequestBodyTimeout < 0 {
		r.add("limits.request_body_timeout_secs", ErrInvalid, "must be 0 (no limit) or more seconds, got %s", formatDuration(l.RequestBodyTimeout))
	}
	if l.RequestBodyMinRate < 0 {
		r.add("limits.request_body_min_rate", ErrInvalid, "must be 0 (no minimum) or more bytes per second, got %d", l.RequestBodyMinRate)
	}
	if l.RequestBodyMinRateGrace <= 0 {
		r.add("limits.request_body_min_rate_grace_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(l.RequestBodyMinRateGrace))
	}
	if l.ResponseStallTimeout < 0 {
		r.add("limits.response_stall_timeout_secs", ErrInvalid, "must be 0 (no limit) or more seconds, got %s", formatDuration(l.ResponseStallTimeout))
	}
	l.validateStalledBudgets(r)
	switch {
	case l.MaxPreAuthConns < 1:
		r.add("limits.max_preauth_conns", ErrInvalid, "must be at least 1, got %d", l.MaxPreAuthConns)
	case l.MaxPreAuthConnsPerIP > l.MaxPreAuthConns:
		r.add("limits.max_preauth_conns_per_ip", ErrInvalid, "%d is above limits.max_preauth_conns %d%s", l.MaxPreAuthConnsPerIP, l.MaxPreAuthConns, r.lineNote("limits.max_preauth_conns"))
	}
	if l.MaxPreAuthConnsPerIP < 1 {
		r.add("limits.max_preauth_conns_per_ip", ErrInvalid, "must be at least 1, got %d", l.MaxPreAuthConnsPerIP)
	}
	if l.HelloTimeout <= 0 || l.HelloTimeout > MaxHelloTimeout {
		r.add("limits.hello_timeout_secs", ErrInvalid, "must be greater than 0 and at most %s seconds, got %s", formatDuration(MaxHelloTimeout), formatDuration(l.HelloTimeout))
	}
	if l.MaxAuthFailuresPerIP < 1 {
		r.add("limits.max_auth_failures_per_ip", ErrInvalid, "must be at least 1, got %d", l.MaxAuthFailuresPerIP)
	}
	if l.AuthFailureWindow <= 0 {
		r.add("limits.auth_failure_window_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(l.AuthFailureWindow))
	}
	if l.AuthBlock <= 0 {
		r.add("limits.auth_block_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(l.AuthBlock))
	}

	for _, q := range []struct {
		key string
		n   int
	}{{"limits.max_sessions", l.MaxSessions}, {"limits.max_tunnels", l.MaxTunnels},
		{"limits.max_tcp_ports", l.MaxTCPPorts}, {"limits.max_event_streams", l.MaxEventStreams},
		{"limits.max_routes", l.MaxRoutes}} {
		if q.n < 0 {
			r.add(q.key, ErrInvalid, "must be 0 (no cap) or more, got %d", q.n)
		}
	}
	if l.RouteTTL <= 0 {
		r.add("limits.route_ttl_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(l.RouteTTL))
	}
}

// validateLoadBalancing checks the [load_balancing] table, then the library's own rules.
func (c *Server) validateLoadBalancing(r *reporter) {
	lb := c.LoadBalancing
	if lb.PreferLocalStreams < 0 {
		r.add("load_balancing.prefer_local_streams", ErrInvalid, "must be 0 (off) or more, got %d", lb.PreferLocalStreams)
	}
	if p := webhookProblem(lb.AlertWebhookURL); p != "" {
		r.fail("load_balancing.alert_webhook_url", ErrInvalid, "%s", p)
	}
	// The library's own rules (the TCP port range, the strategy, the alert URL, the
	// endpoints), after the file's, which leave out what they already reported.
	r.library(c.serverConfig().Validate(), serverKey)
	if lb.AlertMinInterval < 0 {
		r.add("load_balancing.alert_min_interval_secs", ErrInvalid, "must be 0 (off) or more seconds, got %s", formatDuration(lb.AlertMinInterval))
	}
}

// validateCluster checks the [cluster] table, if there is one.
func (c *Server) validateCluster(r *reporter) {
	cl := c.Cluster
	if cl == nil {
		return
	}
	// The library's rule that a cluster's edge opens no Store of its own, as the file puts it.
	if c.Server.StateDir != "" {
		r.add("server.state_dir", ErrInvalid, "cannot be combined with [cluster]%s: a cluster keeps route ownership in NATS JetStream; remove state_dir", r.lineNote("cluster"))
	}
	for i, u := range cl.NATSURLs {
		r.invalid(indexKey("cluster.nats_urls", i), natsURLProblem(u))
	}
	r.library(c.clusterConfig().Validate(), clusterKey)
	// What the file asks besides, and what it reads where the library takes a default.
	if cl.Advertise != "" {
		r.invalid("cluster.advertise", hostPortProblem(cl.Advertise))
	}
	switch {
	case cl.PeerPort != 0 && cl.PeerAddr != c.Server.Addr(cl.PeerPort):
		r.add("cluster.peer_port", ErrInvalid, "cannot be combined with cluster.peer_addr%s: give one of them", r.lineNote("cluster.peer_addr"))
	case cl.PeerPort != 0:
		c.checkPeerAddr(r, "cluster.peer_port", cl.PeerAddr)
	case cl.PeerAddr != "":
		c.checkPeerAddr(r, "cluster.peer_addr", cl.PeerAddr)
	}
	if cl.LeaseTTL <= 0 {
		r.add("cluster.lease_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(cl.LeaseTTL))
	}
	if cl.Replicas < 1 {
		r.add("cluster.replicas", ErrInvalid, "must be 1 to %d, got %d", cluster.MaxReplicas, cl.Replicas)
	}
	if cl.Timeout <= 0 {
		r.add("cluster.timeout_secs", ErrInvalid, "must be greater than 0 seconds, got %s", formatDuration(cl.Timeout))
	}
	t := cl.TLS
	switch {
	case t.CertPath != "" && t.KeyPath == "":
		r.add("cluster.tls.key_path", ErrRequired, "required when cluster.tls.cert_path is set (give both or neither)")
	case t.KeyPath != "" && t.CertPath == "":
		r.add("cluster.tls.cert_path", ErrRequired, "required when cluster.tls.key_path is set (give both or neither)")
	case t.CAPath != "" && !t.Enabled():
		r.add("cluster.tls.ca_path", ErrInvalid, "needs cluster.tls.cert_path and key_path: the edge-to-edge links use TLS only with a certificate")
	}
	r.invalid("cluster.tls.cert_path", checkFile(t.CertPath))
	r.invalid("cluster.tls.key_path", checkFile(t.KeyPath))
	r.invalid("cluster.tls.ca_path", checkFile(t.CAPath))
}

// checkPeerAddr checks the address given by key (cluster.peer_addr or cluster.peer_port):
// "host:port" or ":port", on a port no other listener of the edge uses.
func (c *Server) checkPeerAddr(r *reporter, key, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		r.invalid(key, hostPortProblem(addr))
		return
	}
	if host != "" {
		if p := hostProblem(host); p != "" {
			r.add(key, ErrInvalid, "host %s", p)
			return
		}
	}
	n, err := parsePort(port)
	if err != nil {
		r.add(key, ErrInvalid, "port %v", err)
		return
	}
	s := c.Server
	for _, p := range []struct {
		key  string
		port int
	}{{"server.http_port", s.HTTPPort}, {"server.https_port", s.HTTPSPort}, {"server.control_port", s.ControlPort}, {"server.admin_port", s.AdminPort}} {
		if p.port == n {
			r.add(key, ErrInvalid, "port %d is already used by %s%s", n, p.key, r.lineNote(p.key))
			return
		}
	}
	if pr := c.Limits.TCPPortRange; pr.Contains(n) {
		r.add(key, ErrInvalid, "port %d lies inside limits.tcp_port_range %d-%d, which is reserved for TCP tunnels", n, pr.Low, pr.High)
	}
}

// validateQUICPort checks quic_port: a UDP port, so it may share a TCP port's number.
func (c *Server) validateQUICPort(r *reporter) {
	switch p := c.Server.QUICPort; {
	case p < 0 || p > 65535:
		r.add("server.quic_port", ErrInvalid, "%d is out of range 0-65535 (0 turns QUIC off)", p)
	case p > 0 && !c.TLS.Enabled():
		r.add("server.quic_port", ErrInvalid, "port %d needs a [tls] table with cert_path and key_path: QUIC is always TLS 1.3, and the edge presents that certificate, the one TLS connectors verify on the control port", p)
	}
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
		if p := tunnel.TokenProblem(token); p != "" {
			r.add(key, ErrInvalid, "%s (e.g. the output of `openssl rand -hex 16`)", p)
			return
		}
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
	// The edges' token must be none of the others: whoever holds it can join as an edge.
	if c.Cluster != nil && c.Cluster.Token != "" {
		claim("cluster.token", c.Cluster.Token)
	}
}

// validateStalledBudgets checks the stalled-response budgets: none negative, and a narrower
// one (a connection's, an address's) no larger than a wider one that is set, which would
// make it meaningless.
func (l *Limits) validateStalledBudgets(r *reporter) {
	const (
		total   = "limits.max_stalled_response_bytes"
		perIP   = "limits.max_stalled_response_bytes_per_ip"
		perConn = "limits.max_stalled_response_bytes_per_conn"
	)
	budgets := []struct {
		key string
		v   int64
	}{{perConn, l.MaxStalledResponseBytesPerConn}, {perIP, l.MaxStalledResponseBytesPerIP}, {total, l.MaxStalledResponseBytes}}
	for _, b := range budgets {
		if b.v < 0 {
			r.add(b.key, ErrInvalid, "must be 0 (no bound) or more bytes, got %d", b.v)
		}
	}
	for i, narrow := range budgets {
		for _, wide := range budgets[i+1:] {
			if narrow.v > 0 && wide.v > 0 && narrow.v > wide.v {
				r.add(narrow.key, ErrInvalid, "%d is above %s %d%s", narrow.v, wide.key, wide.v, r.lineNote(wide.key))
				break
			}
		}
	}
}
