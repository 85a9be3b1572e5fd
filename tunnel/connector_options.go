package tunnel

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"time"

	"go.uber.org/zap"
)

// Option configures a connector session (see Dial).
type Option func(*dialOptions)

type dialOptions struct {
	token         string
	tlsConfig     *tls.Config
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	log           *zap.Logger
	reconnect     bool
	backoffMin    time.Duration
	backoffMax    time.Duration
	healthyPeriod time.Duration
	localTimeout  time.Duration
	acceptTimeout time.Duration
	drainTimeout  time.Duration
	client        string
	// hostname is sent with each registration (Register.Host); "" sends none.
	hostname string
	// lookup resolves an edge's host name into addresses to try (see DialServers); nil:
	// names go to the dialer as they are. DialServers sets net.DefaultResolver's unless the
	// dialer was replaced (WithDialer), which then resolves names itself.
	lookup       func(ctx context.Context, host string) ([]string, error)
	customDialer bool
	// attemptTimeout bounds one connection attempt to one edge address: dial, TLS, hello.
	attemptTimeout time.Duration
	// dataReadBuffer fixes the receive buffer of each data connection (0: the kernel's).
	dataReadBuffer int
	// proxy is WithProxy's (proxySet: it was given, nil included); proxyFor, set up by
	// Dial (connector_proxy.go), returns the proxy of an edge address (nil: direct), and is
	// nil itself when no edge is reached through a proxy.
	proxy    *url.URL
	proxySet bool
	proxyFor func(addr string) *url.URL
	proxyTLS *tls.Config // of the connection to an https:// proxy; nil: system roots
	// wsPath is WithWebSocket's path (wsSet: it was given): the session reaches the edge
	// over a WebSocket (connector_websocket.go).
	wsPath string
	wsSet  bool
	// quic is WithQUIC: the session reaches the edge over QUIC (connector_quic.go).
	quic bool
}

func defaultDialOptions() dialOptions {
	return dialOptions{
		log:            zap.NewNop(),
		reconnect:      true,
		backoffMin:     250 * time.Millisecond,
		backoffMax:     30 * time.Second,
		healthyPeriod:  30 * time.Second,
		localTimeout:   5 * time.Second,
		acceptTimeout:  5 * time.Second,
		drainTimeout:   DefaultDrainTimeout,
		client:         "warren",
		hostname:       defaultHostname(),
		attemptTimeout: 30 * time.Second,
		dial:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
}

// WithToken sets the auth token sent in the hello.
func WithToken(token string) Option { return func(o *dialOptions) { o.token = token } }

// WithTLS makes the connector speak TLS to the edge with cfg. The edge's certificate is
// verified (against cfg.RootCAs, or the system roots); skipping verification takes an
// explicit cfg.InsecureSkipVerify. If cfg.ServerName is empty, the host of the edge address
// is used.
func WithTLS(cfg *tls.Config) Option { return func(o *dialOptions) { o.tlsConfig = cfg } }

// WithDialer replaces the function that opens the connection to the edge. Pass an edge's
// Server.DialContext to connect in memory. An error wrapping ErrServerClosed from dial ends
// the session for good (Err wraps it) instead of being retried: the in-memory edge answers
// it once it was closed; with several edge addresses (DialServers), only when every one of
// them answers it. The dialer receives the edge addresses as given: host names are not
// resolved by the session then, and no proxy is used: neither the environment's nor
// WithProxy's (see WithProxy).
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *dialOptions) { o.dial, o.customDialer = dial, true }
}

// WithDataReadBuffer fixes the receive buffer (SO_RCVBUF) of each data connection — the
// dedicated connections that carry the public connections of TCP tunnels — at n bytes;
// n <= 0 (the default) leaves it to the kernel's autotuning. It is for long links: a data
// connection is opened ahead of use and sits idle, and the kernel then grows its buffer
// slowly during its first transfer, so that over a 50 ms round trip a 64 MiB upload through
// a TCP tunnel ran at 0.75–0.93× a fresh TCP connection's rate by default and at 0.96× with
// 4 MiB at both ends (docs/benchmarks.md, WAN; two runs, uploads only). On Linux the connection's
// window limit is raised to n too (TCP_WINDOW_CLAMP), since the connection is already up. The
// kernel caps n at net.core.rmem_max (raise it to use more; the session logs a warning once
// when it was capped), and a fixed buffer may hold up to n bytes per busy connection whose
// backend reads slowly. It applies to TCP connections (and TLS over them) as the dialer
// returns them: a WithDialer that wraps its connections gets a warning and no effect. The
// edge's side of the same connections, which receives downloads, has
// ServerConfig.TCP.DataReadBuffer.
func WithDataReadBuffer(n int) Option { return func(o *dialOptions) { o.dataReadBuffer = n } }

// WithHostname sets the host name the session sends with each tunnel it registers: the
// edge's status page and admin API show it beside the member's id, with the tunnel's name
// (TunnelSpec.Name), so that the members of a pool can be told apart. The default is the
// machine's name (os.Hostname); "" sends none. It is shown only, never checked: the edge
// keeps letters, digits, '.', '-' and '_', replaces any other character with '_', and cuts it
// to 253 bytes (the session sends it so already).
func WithHostname(host string) Option { return func(o *dialOptions) { o.hostname = host } }

// defaultHostname is the machine's name, or "" when the system does not say.
func defaultHostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// WithLogger sets the session's logger (default: none).
func WithLogger(l *zap.Logger) Option {
	return func(o *dialOptions) {
		if l != nil {
			o.log = l
		}
	}
}

// WithReconnect turns reconnecting after a lost connection on (the default) or off.
func WithReconnect(on bool) Option { return func(o *dialOptions) { o.reconnect = on } }

// WithBackoff sets the reconnect delay range: the first retry waits about min, each further
// one twice as long up to max, each with random jitter of ±20%. The delay starts again from
// min once a connection has stayed up for a healthy period (30 s). Defaults 250 ms and 30 s.
func WithBackoff(min, max time.Duration) Option {
	return func(o *dialOptions) {
		if min > 0 {
			o.backoffMin = min
		}
		if max >= o.backoffMin {
			o.backoffMax = max
		}
	}
}

// WithDrainTimeout bounds how long a tunnel's drain (Tunnel.Close, Session.Close) waits for
// its in-flight requests and connections (default DefaultDrainTimeout, 30 s).
func WithDrainTimeout(d time.Duration) Option {
	return func(o *dialOptions) {
		if d > 0 {
			o.drainTimeout = d
		}
	}
}

// WithLocalTimeout bounds dialing the local target of a Forward tunnel, and waiting for an
// in-process Listen tunnel's Accept (default 5 s). When it expires the edge tries another
// member.
func WithLocalTimeout(d time.Duration) Option {
	return func(o *dialOptions) {
		if d > 0 {
			o.localTimeout, o.acceptTimeout = d, d
		}
	}
}

// withHealthyPeriod sets how long a connection must stay up before the reconnect delay
// starts again from its minimum (default 30 s); tests shorten it.
func withHealthyPeriod(d time.Duration) Option { return func(o *dialOptions) { o.healthyPeriod = d } }

// withLookup replaces the resolver of edge host names (see DialServers), also with a
// dialer set by WithDialer; tests use it instead of DNS.
func withLookup(lookup func(ctx context.Context, host string) ([]string, error)) Option {
	return func(o *dialOptions) { o.lookup = lookup }
}
