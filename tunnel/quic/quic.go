// Package quic is the QUIC transport of Warren's connector sessions. A program links it in
// with a blank import, as database/sql drivers are:
//
//	import _ "github.com/warren-tunnel/warren/tunnel/quic"
//
// Then a connector may reach its edge over QUIC (tunnel.WithQUIC, or transport: quic in a
// connector file), and an edge may accept connectors on a UDP port (ServerConfig.QUICAddr,
// tunnel.ServeQUIC, [server] quic_port). A program without the import does not link
// quic-go, and asking it for QUIC fails with an error naming this import.
//
// Over QUIC each stream of the session is a QUIC stream: the connector's control stream,
// and each request or TCP connection the edge dispatches to it. A lost packet stalls only
// the streams whose bytes it carried, not the whole session as over one TCP connection.
// There are no separate data connections. The edge presents its control listener's TLS
// certificate (ServerConfig.TLSConfig) over TLS 1.3 with the ALPN protocol ALPN; the
// connector verifies it as it does over TLS on TCP (tunnel.WithTLS). The Hello, its token,
// the pre-authentication caps and throttles, resume, health, drain and retry are those of
// every transport.
//
// Choices:
//   - 0-RTT is off: a connector's first flight carries its token, and 0-RTT data can be
//     replayed; a reconnect costs one round trip more than it could.
//   - Connection migration is left as quic-go does it: a connector whose address changes
//     (a NAT rebinding) keeps its session when its packets reach the edge from the new
//     address; the edge's throttles keep the address the session began with.
//   - Keep-alive and idle timeout follow the session's liveness rules on yamux: each side
//     pings an idle session, and a session that hears nothing from its peer for
//     mux.DeadPeerTimeout (25 s) ends, so its members leave the edge's pools as fast as
//     over TCP.
package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	qgo "github.com/quic-go/quic-go"

	"github.com/warren-tunnel/warren/internal/mux"
)

// ALPN is the application protocol both sides name in the QUIC handshake.
const ALPN = "warren/1"

// Application error codes a session closes with, and stream error codes.
const (
	codeClosed  qgo.ApplicationErrorCode = 0 // the session ended normally (Close)
	codeAborted qgo.StreamErrorCode      = 1 // a stream cut both ways (mux.Abort)
	codeUnread  qgo.StreamErrorCode      = 2 // a stream closed with its receive side unread
)

// maxEdgeStreams is how many streams the edge may have open to one connector at once (its
// idle HTTP streams included): above it, an open waits for one to end, up to the edge's
// open timeout. yamux has no such limit; this one is far above what a connector serves.
const maxEdgeStreams = 1 << 20

// connectionWindow is a session's flow-control window as a whole: in effect none (see config).
const connectionWindow = 1 << 60

// idleTimeout ends a session that heard nothing from its peer this long (a variable for
// tests).
var idleTimeout = mux.DeadPeerTimeout

// closeTimeout bounds how long a stream this side closed waits for the peer's end before
// its receive side is given up (a variable for tests).
var closeTimeout = mux.StreamCloseTimeout

func init() { mux.RegisterQUIC(transport{}) }

type transport struct{}

// tlsFor returns a copy of cfg for the transport: TLS 1.3 and Warren's ALPN (also in the
// configurations its GetConfigForClient returns), and, for an edge, no session tickets: with
// 0-RTT off they would only save a reconnecting connector one round trip, and each costs
// the edge a ticket written into every connection's state.
func tlsFor(cfg *tls.Config, edge bool) *tls.Config {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg = cfg.Clone()
	cfg.MinVersion = tls.VersionTLS13
	cfg.NextProtos = []string{ALPN}
	cfg.SessionTicketsDisabled = cfg.SessionTicketsDisabled || edge
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if c == nil || err != nil {
				return c, err
			}
			c = tlsFor(c, edge)
			c.GetConfigForClient = nil
			return c, nil
		}
	}
	return cfg
}

// config returns the QUIC configuration of one side.
func config(edge bool, handshake time.Duration) *qgo.Config {
	c := &qgo.Config{
		HandshakeIdleTimeout:   handshake,
		MaxIdleTimeout:         idleTimeout,
		KeepAlivePeriod:        mux.KeepAliveInterval,
		MaxStreamReceiveWindow: mux.StreamWindow,
		// What a stream received and its reader has not taken yet (a response whose public
		// client stopped reading, an upload to a slow backend) also holds the connection's
		// window: with quic-go's default (15 MiB) four stalled downloads would stall every
		// stream of the session. Each stream's window bounds it instead, as over yamux, which
		// has no session-wide window; the edge's stalled-response budgets bound their sum.
		InitialConnectionReceiveWindow: connectionWindow,
		MaxConnectionReceiveWindow:     connectionWindow,
		MaxIncomingUniStreams:          -1,
		// The connector opens one stream, its control stream; the edge opens the others.
		MaxIncomingStreams: maxEdgeStreams,
	}
	if edge {
		c.MaxIncomingStreams = 1
	}
	return c
}

// Dial opens a connector's session to the edge at addr.
func (transport) Dial(ctx context.Context, addr string, tlsConf *tls.Config) (mux.Session, error) {
	conn, err := qgo.DialAddr(ctx, addr, tlsFor(tlsConf, false), config(false, 0))
	if err != nil {
		return nil, fmt.Errorf("quic: %w", err)
	}
	return newSession(conn, 0), nil
}

// Listen accepts connectors' sessions on pc.
func (transport) Listen(pc net.PacketConn, tlsConf *tls.Config, opts mux.ListenOptions) (mux.Listener, error) {
	if tlsConf == nil || (len(tlsConf.Certificates) == 0 && tlsConf.GetCertificate == nil && tlsConf.GetConfigForClient == nil) {
		return nil, errors.New("quic: the edge needs a TLS certificate")
	}
	tr := &qgo.Transport{Conn: pc}
	if opts.Admit != nil {
		tr.VerifySourceAddress = validateEveryAddress
		tr.ConnContext = func(ctx context.Context, info *qgo.ClientInfo) (context.Context, error) {
			return admit(ctx, info, opts.Admit)
		}
	}
	ln, err := tr.Listen(tlsFor(tlsConf, true), config(true, opts.HandshakeTimeout))
	if err != nil {
		return nil, fmt.Errorf("quic: %w", err)
	}
	return &listener{tr: tr, ln: ln, pc: pc, openTimeout: opts.OpenTimeout}, nil
}

// validateEveryAddress makes every new connection prove its source address with a Retry
// (one round trip) before Admit is asked: otherwise one spoofed packet per address would
// hold the edge's places (pre-auth caps) for a handshake timeout, and shut the addresses'
// real connectors out. A connector connects seldom; the round trip is cheap.
func validateEveryAddress(net.Addr) bool { return true }

// admissionKey is the context key of a connection's Admission.
type admissionKey struct{}

// admit asks the listener's Admit about a new connection, before its handshake: refused, the
// connection gets CONNECTION_REFUSED and costs the edge no state; admitted, its Admission
// rides the connection's context and is released when the connection ends.
func admit(ctx context.Context, info *qgo.ClientInfo, admitFn func(net.Addr) mux.Admission) (context.Context, error) {
	if !info.AddrVerified { // validateEveryAddress lets none through unverified
		return nil, errors.New("quic: the client's address is not validated")
	}
	a := admitFn(info.RemoteAddr)
	if a == nil {
		return nil, errors.New("quic: refused by the edge's caps")
	}
	context.AfterFunc(ctx, a.Release)
	return context.WithValue(ctx, admissionKey{}, a), nil
}

// listener is an edge's QUIC listener. Its sessions ride its UDP socket, so the socket is
// closed only once the listener is closed and its last session was closed (Session.Close).
type listener struct {
	tr          *qgo.Transport
	ln          *qgo.Listener
	pc          net.PacketConn
	openTimeout time.Duration

	mu     sync.Mutex
	live   int
	closed bool
	done   bool
}

func (l *listener) Accept(ctx context.Context) (mux.Session, mux.Admission, error) {
	conn, err := l.ln.Accept(ctx)
	if err != nil {
		return nil, nil, err
	}
	a, _ := conn.Context().Value(admissionKey{}).(mux.Admission)
	l.mu.Lock()
	l.live++
	l.mu.Unlock()
	s := newSession(conn, l.openTimeout)
	// The edge closes every session it accepted, however it ended; the last one closed
	// after the listener releases the socket, before that Close returns.
	s.onClose = func() {
		l.mu.Lock()
		l.live--
		l.mu.Unlock()
		l.maybeRelease()
	}
	return s, a, nil
}

func (l *listener) Close() error {
	err := l.ln.Close()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.maybeRelease()
	return err
}

// maybeRelease closes the transport and the socket once nothing uses them.
func (l *listener) maybeRelease() {
	l.mu.Lock()
	release := l.closed && l.live == 0 && !l.done
	if release {
		l.done = true
	}
	l.mu.Unlock()
	if release {
		_ = l.tr.Close()
		_ = l.pc.Close()
	}
}

func (l *listener) Addr() net.Addr { return l.ln.Addr() }
