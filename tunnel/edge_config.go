package tunnel

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/webhook"
)

// ServerConfig configures an edge. The zero value is a working in-memory edge: public
// domain "localhost", no authentication, load balancing off, no TCP port range, and
// default timeouts. Every field is optional, and so is every field of its sub-structs:
// the zero value of each takes the default its documentation names.
type ServerConfig struct {
	// Domain is the public domain: HTTP tunnels are reached at <subdomain>.<Domain>.
	// Default "localhost".
	Domain string
	// RegionID names this edge in alerts and metrics. Default "local".
	RegionID string
	// Logger receives the edge's logs. Default zap.NewNop().
	Logger *zap.Logger

	// Auth checks connector tokens. Nil accepts every connector, with or without a token.
	Auth Authenticator
	// ControlAddr is the address ListenAndServe listens on for connectors. Default ":4040".
	ControlAddr string
	// TLSConfig, when set, makes the control listener of ListenAndServe speak TLS and is
	// used for the public HTTPS listener.
	TLSConfig *tls.Config
	// QUICAddr, when set (e.g. ":4443"), is the UDP address ListenAndServe accepts
	// connectors on over QUIC (ServeQUIC): it needs TLSConfig, whose certificate the edge
	// presents (ListenAndServe fails without), and package tunnel/quic imported by the
	// program (NewServer fails without). Off by default.
	QUICAddr string

	// Public configures the public HTTP(S) listeners: their addresses, the ports written
	// into tunnel URLs, HTTP/2, the proxies trusted in front of the edge, and the limits
	// that protect them from slow or hostile clients.
	Public PublicHTTP
	// RequestBody bounds public request bodies: their size, their time and their rate.
	RequestBody RequestBodyLimits
	// StalledResponses bounds the responses whose public client is not keeping up.
	StalledResponses StalledResponseLimits
	// TCP configures TCP tunnels: their public ports and the data connections that carry
	// their public connections.
	TCP TCPTunnels
	// LoadBalancing turns pools on and says how a member is picked for each request or
	// connection, and what happens when one fails.
	LoadBalancing LoadBalancing
	// Timeouts bound opening a stream to a member, draining a member, and idle pooled
	// streams.
	Timeouts Timeouts
	// PreAuth bounds the control connections that have not authenticated yet, and throttles
	// failed authentications.
	PreAuth PreAuthLimits
	// Limits caps what one connector session and one tenant may hold and ask for. Reload
	// changes it live.
	Limits Limits
	// Alerts configures the group_zero_healthy alert POSTs, and the opt-ins: a minimum
	// interval between two alerts of a pool, and group_recovered alerts.
	Alerts Alerts

	// OnEvent, when set, receives every group membership and health change (joins,
	// leaves, health transitions, drains) in order per group, with no lock of the edge
	// held: it may read the edge (Registry, Operator). The event holds copies. It
	// holds up the next event of its group, so it should return quickly.
	OnEvent func(group.Event)

	// Store keeps route ownership (route → tenant, pool name, key hash, TCP ports). One
	// that keeps it on disk makes it survive restarts: boltstore.Open(dir) keeps it in an
	// embedded database file in dir. Nil keeps it in memory only (store.Memory), for as long
	// as the process runs. The edge closes it when it closes; after a NewServer that failed,
	// close it yourself (a Store closed twice does no harm). Reload takes a Store the edge
	// is not running with for a change it cannot apply: pass the same one again.
	Store store.Store
	// Cluster, when set, makes the edge one of a cluster that shares routes and pools
	// (package tunnel/cluster makes one on NATS JetStream); Store must then be unset: the
	// cluster's edges share the route store it provides. A Cluster serves one Server. Nil
	// is a single edge, which runs no cluster code.
	Cluster Cluster
	// RouteTTL is how long a route stays its owner's after its last member left. Default
	// 24 h.
	RouteTTL time.Duration
	// Endpoints are routes reserved for a tenant, with their traffic policy. Reload adds,
	// removes and changes them live.
	Endpoints []Endpoint
}

// PublicHTTP configures the edge's public HTTP(S) listeners (ServerConfig.Public).
type PublicHTTP struct {
	// HTTPAddr and HTTPSAddr are the public listen addresses used by ListenAndServe; an
	// empty one means that listener is off. HTTPSAddr needs ServerConfig.TLSConfig.
	HTTPAddr, HTTPSAddr string
	// URLHTTPPort and URLHTTPSPort are the ports written into tunnel URLs; 0 means the port
	// of the first public listener served (80 and 443 are left out of URLs).
	URLHTTPPort, URLHTTPSPort int
	// H2C makes the public HTTP listener (ServePublic) serve HTTP/2 over cleartext with
	// prior knowledge too, e.g. gRPC clients without TLS. Off by default: such a client is
	// then refused at once (an HTTP/2 GOAWAY, HTTP_1_1_REQUIRED). The "Upgrade: h2c" dance
	// is not supported.
	H2C bool
	// DisableHTTP2 keeps the public HTTPS listener (ServePublicTLS) on HTTP/1.1. By default
	// it offers HTTP/2 ("h2" in ALPN, added to a copy of TLSConfig), with at most 250
	// requests in flight per connection. Each HTTP/2 request is dispatched on its own, as
	// an HTTP/1.1 one.
	DisableHTTP2 bool
	// TrustedProxies are the addresses of the proxies in front of the edge (a load
	// balancer, a CDN) whose forwarding headers it believes. The edge tells each backend
	// who its client is in X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Forwarded
	// (RFC 7239) and X-Real-IP. A request whose TCP peer is in one of these prefixes keeps
	// its X-Forwarded-For and Forwarded, with the peer appended, and its X-Forwarded-Proto
	// and X-Forwarded-Host, and its X-Real-IP is the right-most address of the chain
	// (X-Forwarded-For, else Forwarded) that is not a trusted proxy, as nginx's
	// real_ip_recursive. From any other peer, the client's own values of all five are
	// dropped and replaced by the edge's: the peer's address, the listener's scheme, the
	// Host. The other headers only a proxy may set (X-Forwarded-Ssl, -Scheme, -Port,
	// Front-End-Https, X-Client-IP, True-Client-IP, CF-Connecting-IP, X-Original-URL and
	// the like) are kept from a trusted proxy and dropped from any other peer; the edge does
	// not set them itself. Nil (the default) trusts no peer. Each prefix must be valid
	// (NewServer refuses the zero Prefix); a restart applies a change.
	TrustedProxies []netip.Prefix
	// ReadHeaderTimeout, IdleTimeout and MaxHeaderBytes protect the public HTTP listeners
	// from slow or hostile clients. Defaults 10 s, 120 s, 32 KiB. The admin listener has
	// them too, and twice ReadHeaderTimeout for a whole request, body included. A request
	// whose headers are over MaxHeaderBytes gets 431: over HTTP/1.1 the connection is then
	// closed, over HTTP/2 only that stream ends. The public HTTP/2 servers decode a header
	// block up to twice MaxHeaderBytes (at least 64 KiB) to answer it so; one header field
	// past that ends the HTTP/2 connection (COMPRESSION_ERROR), as the edge would have to
	// hold it.
	ReadHeaderTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                 int
	// WebSocketPath, when set (e.g. "/_warren/connect"), lets connectors reach the edge
	// over a WebSocket on the public HTTPS listener (ServePublicTLS): an HTTP/1.1 upgrade
	// (RFC 6455) at this path, for a connector behind a proxy or a CDN that passes only
	// HTTPS (tunnel.WithWebSocket). The path is the edge's only on its own domain: a
	// request whose Host is Domain (any port). A request for any other host, a tunnel's
	// <subdomain>.<Domain> included, goes to its tunnel whatever its path. A session over
	// WebSocket is a session as over the control listener: same token, same
	// pre-authentication caps and throttles (the upgrade takes its place among the
	// connections not yet authenticated: over a cap it is answered 503; the caps and the
	// throttle count the TCP peer's address or, from a peer in TrustedProxies, the client
	// its forwarding headers name, as X-Real-IP), same resume,
	// health, drain and retry; its TCP tunnels' connections ride its yamux streams (no data
	// connections). HTTP/2's extended CONNECT (RFC 8441) is not offered. "" (the default):
	// off. It must begin with "/", be clean (no "..", "//" or trailing "/"), and hold no
	// query, fragment, space or control character.
	WebSocketPath string
	// WebSocketOnHTTP serves WebSocketPath on the public HTTP listener (ServePublic) too,
	// for an edge behind a proxy that terminates TLS and forwards in plain HTTP. Off by
	// default: the connector's token would cross the network in the clear.
	WebSocketOnHTTP bool
}

// RequestBodyLimits bounds public request bodies (ServerConfig.RequestBody).
type RequestBodyLimits struct {
	// MaxBytes caps public request bodies (413 above it); 0 means unlimited.
	MaxBytes int64
	// Timeout bounds how long a public request body may take to arrive, from the edge's
	// first read of it (when it starts forwarding it). A body still incomplete then gets 408
	// Request Timeout if no response has started, and its exchange is aborted otherwise;
	// either way the member's stream is closed. Default 60 s; negative means no limit. On
	// HTTP/1.x, an answer that leaves its request body unread (a 408, an edge's 404, a
	// backend answering without reading the upload) closes the connection, and the edge
	// reads what still comes of that body for Timeout, at most 5 s, before the close, on
	// every listener, admin included.
	Timeout time.Duration
	// MinRate is the slowest average rate, in bytes per second since the edge's first read,
	// at which a public request body may arrive once MinRateGrace has passed: byte n must
	// have arrived by grace + n/rate (a body too slow is treated as for Timeout). Default
	// 1024 (1 KiB/s); negative means no minimum.
	MinRate int64
	// MinRateGrace is how long a request body may take before MinRate applies. Default
	// 10 s.
	MinRateGrace time.Duration
}

// StalledResponseLimits bounds the responses whose public client is not keeping up
// (ServerConfig.StalledResponses).
type StalledResponseLimits struct {
	// Timeout cuts a response whose write to its public client has made no progress for
	// this long (a client that stopped reading): an HTTP/1.x client's connection is closed,
	// an HTTP/2 client's stream is reset (the connection goes on), and the member's stream
	// is closed. The edge writes a response in chunks of at most 64 KiB, so a client must
	// take about 1 KiB/s to keep a response going. It also bounds the last write of a
	// response, after the handler. Default 60 s, as nginx's send_timeout; negative means no
	// limit.
	Timeout time.Duration
	// MaxBytesPerConn, MaxBytesPerIP and MaxBytes bound what responses whose public client
	// is not keeping up may hold at the edge: per public connection, per client address (the
	// connection's remote address: an IPv4 address or an IPv6 /64; forwarding headers are
	// not believed for this) and for the whole edge. A response is not keeping up while one
	// of its writes to the client has been blocked for more than 20 ms; it then counts what
	// its member may send ahead of the client, which the edge holds: its data stream's
	// receive window, 4 MiB (1 MiB for an h2c backend), or the rest of its body when that
	// is known and shorter; about three times that in resident memory. A response that
	// would take a budget over is cut at once (as for Timeout), the ones already counted
	// keep their place. Defaults 16 MiB, 32 MiB and 256 MiB (4, 8 and 64 stalled
	// downloads); negative means no budget. Everyone behind one address (a NAT) shares its
	// budget.
	MaxBytesPerConn, MaxBytesPerIP, MaxBytes int64
}

// TCPTunnels configures TCP tunnels (ServerConfig.TCP).
type TCPTunnels struct {
	// Ports is the inclusive range TCP tunnels take their public port from. The zero range
	// refuses TCP tunnels with ErrNoPorts.
	Ports group.PortRange
	// BindHost is the address TCP tunnel listeners bind to. Default "" (all addresses).
	BindHost string
	// Listen, when set, replaces net.Listen for TCP tunnel ports (tests can hand out
	// in-memory listeners). It should return an error wrapping group.ErrPortUnavailable when
	// the port is taken, so the next port is tried.
	Listen func(port int) (net.Listener, error)
	// DataReadBuffer fixes the receive buffer (SO_RCVBUF) of the edge's side of each data
	// connection — the dedicated connections that carry TCP tunnels' public connections and
	// receive their downloads — at this many bytes; 0 (the default) leaves it to the kernel's
	// autotuning. For long links between connectors and the edge; see WithDataReadBuffer for
	// the connector's side, what it buys and what it costs.
	DataReadBuffer int
}

// LoadBalancing configures pools (ServerConfig.LoadBalancing).
type LoadBalancing struct {
	// Enabled is the kill switch for groups: when false (the default) the group fields of a
	// registration are accepted and ignored, and every tunnel is solo.
	Enabled bool
	// Strategy picks a member per request or connection: "least_streams" (default) or
	// "random".
	Strategy string
	// NewStrategy, when set, makes each new pool's dispatch strategy and Strategy is
	// ignored: an embedder's own dispatch.Strategy. It is called once per pool, so a
	// strategy may keep per-pool state (as LeastStreams keeps its tie rotation); Pick is
	// called concurrently and must not block.
	NewStrategy func() dispatch.Strategy
	// RetryUnreadRequests lets the edge send a bodyless HTTP request to one other member
	// when the first member's backend reset its TCP connection with the request still
	// unread (its connector says so with an unread notice: internal/wire/spec.md). The
	// kernel resets on close only when the application left received bytes unread, so
	// such a request never reached a handler; this saves the requests queued in a backend
	// that dies. Off by default: by default the edge picks another member only when
	// opening the stream fails, and never once a request byte was written.
	RetryUnreadRequests bool
	// RetryIdempotent turns the idempotent retry on for every pool (a pool can also ask for
	// it: TunnelSpec.RetryIdempotent): a GET, HEAD, OPTIONS, PUT or DELETE, or any request
	// with an Idempotency-Key header, whose body is at most 64 KiB (the edge buffers it) is
	// sent once to another member when its member fails before any response byte, even if
	// the request may have reached the first member's application. This is what nginx and
	// Go's http.Transport do; it is off by default because it may run a request twice.
	RetryIdempotent bool
	// OutlierEjection, when set, turns passive outlier ejection on: a member whose streams
	// keep failing (open refused, reset before a response, 502) is ejected for a while even
	// if its probe passes, never more than half of a pool at once and never the last member
	// that can take work. Zero fields take group.DefaultEjection's values (5 failures in a
	// row within 10 s eject for 30 s, doubling up to 5 min). Nil (the default): off.
	OutlierEjection *group.Ejection
	// MaxConcurrentPerMember caps the in-flight requests and TCP connections of each member
	// (0: no cap). When every member of a group is at its cap, HTTP gets a 503 saying so and
	// TCP connections are closed: a flood on one group cannot take all of a connector's
	// capacity, nor the edge's.
	MaxConcurrentPerMember int
	// PreferLocalStreams, in a cluster, lets a pool's members attached to this edge take new
	// work ahead of the pool's members on other edges (no edge-to-edge hop), while they are
	// less than this many active streams ahead of them: 1 gives ties to a local member, N
	// bounds how far the local members may run ahead. 0 (the default): ties rotate over the
	// whole pool, local and remote members alike, as on one edge.
	PreferLocalStreams int
}

// Timeouts bound the edge's work with members (ServerConfig.Timeouts).
type Timeouts struct {
	// Open bounds opening a data stream to a member, including its acknowledgement (the
	// connector dials its backend first). Default 10 s.
	Open time.Duration
	// Drain bounds how long a draining member's open streams may run before it is removed
	// anyway. Default 30 s.
	Drain time.Duration
	// IdleStream is how long an idle keep-alive stream to a member is kept for reuse. It
	// should be shorter than the backends' own keep-alive timeouts (5 s in Node and Apache):
	// a request sent on a stream whose backend connection has just closed fails with 502 (it
	// is never replayed), and a pooled stream older than this is never used. Default 4 s.
	IdleStream time.Duration
}

// PreAuthLimits bounds what an address may cost the edge before it has authenticated
// (ServerConfig.PreAuth).
type PreAuthLimits struct {
	// HelloTimeout bounds how long a new control connection may take, from its accept, to
	// finish its TLS handshake, open its control stream and send its Hello; the connection is
	// closed then. Over WebSocket (Public.WebSocketPath) it runs from the upgrade: the TLS
	// handshake and the request before it are the public listener's (ReadHeaderTimeout).
	// Default 5 s.
	HelloTimeout time.Duration
	// MaxConns and MaxConnsPerIP cap the control connections whose Hello has not been
	// accepted yet (TLS handshake, control stream, Hello, token check), in all and per
	// source address (an IPv4 address, or an IPv6 /64); a connection over either cap is
	// closed at once, before anything is read from it. In a cluster the peer port has caps
	// of its own with the same values, for the edge links whose handshake is under way. A
	// connection whose remote address is not an IP address (net.Pipe, DialContext) counts
	// toward MaxConns only. Defaults 256 and 16.
	MaxConns, MaxConnsPerIP int
	// MaxAuthFailuresPerIP, AuthFailureWindow and AuthBlockDuration throttle token guessing
	// per source address (an IPv4 address, or an IPv6 /64), on the control and admin
	// listeners (and a cluster's peer port) together: an address with MaxAuthFailuresPerIP
	// failed authentications within AuthFailureWindow is refused for AuthBlockDuration (from
	// that failure) without its token being checked: a connector gets an "unavailable" error
	// it retries after its backoff, the admin API answers 429 with Retry-After. Tokens still
	// being checked count as failures until they pass, so no address has more tokens checked
	// than that in a window. Failures are logged in aggregate: at most one line per address
	// per minute, with counts. Defaults 10, 10 min, 15 min. Everyone behind one address (a
	// NAT, a proxy in front of the admin listener) shares its count.
	MaxAuthFailuresPerIP                 int
	AuthFailureWindow, AuthBlockDuration time.Duration
	// AuthFailureDelay is how long an attempt from an address with one failed
	// authentication in its window waits before its token is checked; each further failure
	// doubles it, up to 2 s. Default 250 ms; negative: no delay.
	AuthFailureDelay time.Duration
}

// Limits caps what one connector session and one tenant may hold and ask for
// (ServerConfig.Limits). Reload changes every field live: a new cap applies to the next
// session, registration or event stream, and a lowered one takes nothing back.
type Limits struct {
	// MaxTunnelsPerSession caps the tunnels one connector session may hold. Default 16.
	MaxTunnelsPerSession int
	// RegisterRate and RegisterBurst limit how fast one session may register tunnels
	// (token bucket: RegisterRate per second, bursts of RegisterBurst). Defaults 5/s and
	// MaxTunnelsPerSession; a flood gets ErrLimit rejections and costs the edge little.
	// A change applies to the sessions that connect after it.
	RegisterRate  float64
	RegisterBurst int
	// Tenant caps what each tenant may hold (0: no cap); PerTenant overrides it per tenant
	// name, field by field.
	Tenant    TenantLimits
	PerTenant map[string]TenantLimits
}

// Alerts configures the alert POSTs of pools that reach zero healthy members
// (ServerConfig.Alerts). Its zero value follows the alert document's rule: each time a pool
// that had a healthy member falls to zero, every destination gets one group_zero_healthy
// POST at once, however often the pool flaps; a pool that stays down gets no more, and a
// recovery sends nothing. MinInterval and OnRecovery are opt-ins.
type Alerts struct {
	// WebhookURL is the operator's URL: the edge POSTs a group_zero_healthy alert to it
	// whenever any group reaches zero healthy members, in addition to the tenant URLs the
	// group's members registered. It is trusted (it may point at a private address).
	WebhookURL string
	// AllowPrivateWebhooks lets tenant alert URLs resolve to loopback, private and
	// link-local addresses. Off by default: a tenant must not make the edge POST inside its
	// own network.
	AllowPrivateWebhooks bool
	// Timeout bounds one alert POST. Default 5 s.
	Timeout time.Duration
	// MinInterval, when above 0, is the shortest time between two alerts of one group,
	// however fast its members flap: what happens inside it is held back and reported when
	// the interval since the group's previous alert ends (with OnRecovery, the group's
	// state at that moment, group_zero_healthy or group_recovered; without it, a
	// group_zero_healthy alert for the falls held back). Default 0: no interval, every fall
	// alerts at once (a negative value is 0). See webhook.Debouncer for the rules.
	MinInterval time.Duration
	// OnRecovery also POSTs a group_recovered alert when a group that fell to zero healthy
	// members has a healthy member again. Default false: the alert document's payload has
	// one event, group_zero_healthy; a recovery only makes the next fall alert again.
	OnRecovery bool
}

// Defaults of the stalled-response limits (ServerConfig.StalledResponses: Timeout and the
// MaxBytes budgets).
const (
	DefaultResponseStallTimeout           = 60 * time.Second
	DefaultMaxStalledResponseBytesPerConn = 16 << 20
	DefaultMaxStalledResponseBytesPerIP   = 32 << 20
	DefaultMaxStalledResponseBytes        = 256 << 20
)

const (
	// DefaultControlPort is the port of the default ControlAddr, ":4040".
	DefaultControlPort = 4040
	// DefaultDrainTimeout bounds a drain by default: an edge's draining member
	// (ServerConfig.Timeouts.Drain) and a connector's tunnel (WithDrainTimeout).
	DefaultDrainTimeout = 30 * time.Second
)

// WithDefaults returns a copy of c whose zero settings hold the values NewServer gives them:
// every default this type's documentation names (but for LoadBalancing.NewStrategy, which
// NewServer makes from Strategy). A program that reads its settings from elsewhere (package
// tunnel/config does) takes its defaults from here.
func (c ServerConfig) WithDefaults() ServerConfig {
	if c.Domain == "" {
		c.Domain = "localhost"
	}
	if c.RegionID == "" {
		c.RegionID = "local"
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.ControlAddr == "" {
		c.ControlAddr = ":" + strconv.Itoa(DefaultControlPort)
	}
	c.PreAuth = c.PreAuth.withDefaults()
	c.Timeouts = c.Timeouts.withDefaults()
	c.Limits = c.Limits.withDefaults()
	c.Public = c.Public.withDefaults()
	c.RequestBody = c.RequestBody.withDefaults()
	c.StalledResponses = c.StalledResponses.withDefaults()
	if c.Alerts.Timeout <= 0 {
		c.Alerts.Timeout = webhook.DefaultTimeout
	}
	if c.Alerts.MinInterval < 0 {
		c.Alerts.MinInterval = 0
	}
	if c.LoadBalancing.Strategy == "" && c.LoadBalancing.NewStrategy == nil {
		c.LoadBalancing.Strategy = dispatch.NameLeastStreams
	}
	if c.RouteTTL <= 0 {
		c.RouteTTL = defaultRouteTTL
	}
	return c
}

// positiveOr returns v, or def when v is 0 or less (the "unset" of a setting that has no
// meaning at 0).
func positiveOr[T int | int64 | float64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// nonZeroOr returns v, or def when v is 0: the settings whose negative values mean "off".
func nonZeroOr[T int | int64 | float64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func (p PreAuthLimits) withDefaults() PreAuthLimits {
	p.HelloTimeout = positiveOr(p.HelloTimeout, 5*time.Second)
	p.MaxConns = positiveOr(p.MaxConns, throttle.DefaultMaxConns)
	p.MaxConnsPerIP = positiveOr(p.MaxConnsPerIP, throttle.DefaultMaxConnsPerKey)
	p.MaxAuthFailuresPerIP = positiveOr(p.MaxAuthFailuresPerIP, throttle.DefaultMaxFailures)
	p.AuthFailureWindow = positiveOr(p.AuthFailureWindow, throttle.DefaultFailureWindow)
	p.AuthBlockDuration = positiveOr(p.AuthBlockDuration, throttle.DefaultBlock)
	p.AuthFailureDelay = nonZeroOr(p.AuthFailureDelay, throttle.DefaultFailureDelay)
	return p
}

func (t Timeouts) withDefaults() Timeouts {
	t.Open = positiveOr(t.Open, 10*time.Second)
	t.Drain = positiveOr(t.Drain, DefaultDrainTimeout)
	t.IdleStream = positiveOr(t.IdleStream, 4*time.Second)
	return t
}

func (l Limits) withDefaults() Limits {
	l.MaxTunnelsPerSession = positiveOr(l.MaxTunnelsPerSession, 16)
	l.RegisterRate = positiveOr(l.RegisterRate, 5)
	l.RegisterBurst = positiveOr(l.RegisterBurst, l.MaxTunnelsPerSession)
	return l
}

func (p PublicHTTP) withDefaults() PublicHTTP {
	p.ReadHeaderTimeout = positiveOr(p.ReadHeaderTimeout, 10*time.Second)
	p.IdleTimeout = positiveOr(p.IdleTimeout, 120*time.Second)
	p.MaxHeaderBytes = positiveOr(p.MaxHeaderBytes, 32<<10)
	return p
}

func (r RequestBodyLimits) withDefaults() RequestBodyLimits {
	r.Timeout = nonZeroOr(r.Timeout, 60*time.Second)
	r.MinRate = nonZeroOr(r.MinRate, 1024)
	r.MinRateGrace = positiveOr(r.MinRateGrace, 10*time.Second)
	return r
}

func (s StalledResponseLimits) withDefaults() StalledResponseLimits {
	s.Timeout = nonZeroOr(s.Timeout, DefaultResponseStallTimeout)
	s.MaxBytesPerConn = nonZeroOr(s.MaxBytesPerConn, DefaultMaxStalledResponseBytesPerConn)
	s.MaxBytesPerIP = nonZeroOr(s.MaxBytesPerIP, DefaultMaxStalledResponseBytesPerIP)
	s.MaxBytes = nonZeroOr(s.MaxBytes, DefaultMaxStalledResponseBytes)
	return s
}

// Validate reports the settings of c that NewServer refuses, each a *FieldError (joined when
// there are several), or returns nil: a TCP port range out of order or outside 1-65535, a
// TrustedProxies prefix that is not valid, a Public.WebSocketPath that is not a clean
// absolute path, an unknown Strategy (when NewStrategy is nil), an
// Alerts.WebhookURL that is not an absolute http(s) URL, and an endpoint that is malformed
// or that reserves the route or the TCP port of another. Reload runs it too.
func (c ServerConfig) Validate() error {
	var errs []error
	if r := c.TCP.Ports; r != (group.PortRange{}) {
		switch {
		case r.Lo < 1 || r.Lo > 65535:
			errs = append(errs, fieldErr("TCP.Ports", "low port %d is out of range 1-65535", r.Lo))
		case r.Hi < 1 || r.Hi > 65535:
			errs = append(errs, fieldErr("TCP.Ports", "high port %d is out of range 1-65535", r.Hi))
		case r.Lo > r.Hi:
			errs = append(errs, fieldErr("TCP.Ports", "low port %d is above high port %d", r.Lo, r.Hi))
		}
	}
	for i, p := range c.Public.TrustedProxies {
		if !p.IsValid() {
			errs = append(errs, fieldErr(fmt.Sprintf("Public.TrustedProxies[%d]", i), "is not a valid prefix"))
		}
	}
	errs = append(errs, c.Public.validateWebSocket()...)
	errs = append(errs, c.validateQUIC()...)
	if c.LoadBalancing.NewStrategy == nil {
		if _, err := dispatch.New(c.LoadBalancing.Strategy); err != nil {
			errs = append(errs, fieldErr("LoadBalancing.Strategy", "%q is not a strategy; use %q or %q",
				c.LoadBalancing.Strategy, dispatch.NameLeastStreams, dispatch.NameRandom))
		}
	}
	if c.Alerts.WebhookURL != "" {
		if err := webhook.ValidateURL(c.Alerts.WebhookURL); err != nil {
			errs = append(errs, &FieldError{Field: "Alerts.WebhookURL", Err: err})
		}
	}
	routes, ports := map[string]int{}, map[int]int{}
	for i := range c.Endpoints {
		ep := &c.Endpoints[i]
		name := fmt.Sprintf("Endpoints[%d]", i)
		if err := ep.validate(c.TCP.Ports); err != nil {
			errs = append(errs, under(name, err))
			continue
		}
		key := store.Key(ep.kind(), ep.label())
		if j, dup := routes[key]; dup {
			errs = append(errs, fieldErr(name, "reserves the route %s, as Endpoints[%d] does", key, j))
			continue
		}
		routes[key] = i
		if ep.kind() != store.KindTCP || ep.Port == 0 {
			continue
		}
		// One port serves one pool: the second endpoint's clients would reach whoever
		// registered first.
		if j, dup := ports[ep.Port]; dup {
			errs = append(errs, fieldErr(name+".Port", "port %d is reserved by Endpoints[%d] too, for %s",
				ep.Port, j, store.Key(store.KindTCP, c.Endpoints[j].label())))
			continue
		}
		ports[ep.Port] = i
	}
	return errors.Join(errs...)
}

// setDefaults applies the defaults, validates, and makes the strategy of new pools.
func (c *ServerConfig) setDefaults() error {
	*c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return err // each a *FieldError: "tunnel: Field: ..."
	}
	if c.LoadBalancing.NewStrategy == nil {
		name := c.LoadBalancing.Strategy
		c.LoadBalancing.NewStrategy = func() dispatch.Strategy {
			st, _ := dispatch.New(name)
			return st
		}
	}
	return nil
}
