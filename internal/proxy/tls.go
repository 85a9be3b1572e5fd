package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
)

// TLS passthrough (group.ProtoTLS) on the public HTTPS listener.
//
// Every connection the HTTPS listener accepts first has its ClientHello read (not
// consumed), within a deadline: the TLS records that carry it, reassembled when a client
// spreads it over several (OpenSSL's max_send_frag, a long ALPN list, a post-quantum key
// share), a ClientHello of at most 16 KiB in at most MaxClientHelloRead bytes. When the
// server name it carries is <sub>.<Domain> and sub is the route of a tls pool, the raw
// connection goes to one member of the pool, as a TCP connection would (a failed stream
// open is retried once on another member), with the bytes read replayed first, records
// unchanged: the member's backend does the handshake, so its certificate, ALPN and client
// certificates work end to end and the edge never sees plaintext. Every other connection
// (another name, no name, not a ClientHello at all, one too large or too fragmented to
// read) goes on to the edge's own TLS server with the same bytes replayed, as if nothing
// had been read; that server refuses the handshake of a name that is a tls pool's
// (PassthroughName), whatever the router made of it.

const (
	// tlsRecordHeaderLen is a TLS record's header: type(1) version(2) length(2).
	tlsRecordHeaderLen = 5
	// maxTLSRecord is the largest plaintext TLS record (2^14 bytes).
	maxTLSRecord = 16 << 10
	// maxClientHello is the largest ClientHello (handshake header included) the router
	// reassembles to read its server name: a record's worth, many times what browsers and
	// TLS libraries send, post-quantum key shares included.
	maxClientHello = 16 << 10
	// MaxClientHelloRead is the most a connection of the HTTPS listener has read of it
	// before it is routed: the records of a ClientHello of maxClientHello bytes, with room
	// for 800 record headers (512-byte records take 32).
	MaxClientHelloRead = maxClientHello + 4<<10

	tlsRecordHandshake    = 22
	tlsHandshakeHello     = 1
	tlsExtServerName      = 0
	tlsServerNameHostName = 0
)

// PassthroughOptions configures HTTP.PassthroughListener.
type PassthroughOptions struct {
	// HelloTimeout bounds the time a new connection has to send its ClientHello, every
	// record of it; a connection that has not sent it by then is closed. Default 10 s.
	HelloTimeout time.Duration
	// Go runs f in a new goroutine that the caller waits for, or reports false, without
	// running it, once the caller is shutting down. Nil: the listener's own goroutines,
	// which its Wait waits for.
	Go func(f func()) bool
	// Connections counts the connections carried to a tls pool; nil: not counted.
	Connections *atomic.Uint64
}

// PassthroughListener is the public HTTPS listener's router (HTTP.PassthroughListener): it
// accepts from the TCP listener underneath, carries the connections meant for a tls pool
// itself, and returns every other connection from Accept, to be wrapped by tls.NewListener
// for the edge's HTTPS server, with the bytes it read replayed first.
type PassthroughListener struct {
	net.Listener
	h    *HTTP
	opts PassthroughOptions
	wg   sync.WaitGroup // the goroutines started when opts.Go is nil

	start  sync.Once
	ready  chan net.Conn // connections for the TLS server, with their ClientHello replayed
	done   chan struct{} // closed by Close
	failed chan struct{} // closed when the accept loop ended with err
	err    error

	mu      sync.Mutex
	closed  bool
	pending map[net.Conn]struct{} // connections whose ClientHello is being read
}

// PassthroughListener returns the listener that routes the connections of l, the public
// HTTPS listener's TCP listener, by the server name of their ClientHello: those naming a
// tls pool are carried to one of its members; Accept returns the others. The listener
// starts accepting on its first Accept. Close closes l and the connections whose
// ClientHello is still awaited; connections carried to a pool end with their member's
// tunnel or their client.
func (h *HTTP) PassthroughListener(l net.Listener, o PassthroughOptions) *PassthroughListener {
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = 10 * time.Second
	}
	pl := &PassthroughListener{Listener: l, h: h, opts: o, ready: make(chan net.Conn),
		done: make(chan struct{}), failed: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	if pl.opts.Go == nil {
		pl.opts.Go = func(f func()) bool { pl.wg.Go(f); return true }
	}
	return pl
}

// Accept returns the next connection that is not for a tls pool.
func (l *PassthroughListener) Accept() (net.Conn, error) {
	l.start.Do(func() {
		if !l.opts.Go(l.acceptLoop) {
			l.fail(net.ErrClosed)
		}
	})
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.failed:
		return nil, l.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close closes the TCP listener and every connection whose ClientHello is awaited.
func (l *PassthroughListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	for c := range l.pending {
		_ = c.Close()
	}
	clear(l.pending)
	l.mu.Unlock()
	return err
}

// Wait waits for the goroutines the listener started itself (PassthroughOptions.Go nil):
// call it after Close, once the members' tunnels have ended.
func (l *PassthroughListener) Wait() { l.wg.Wait() }

func (l *PassthroughListener) fail(err error) {
	l.err = err
	close(l.failed)
}

// acceptLoop accepts from the TCP listener until it fails, and routes each connection in a
// goroutine of its own, so that a client slow to send its ClientHello holds nobody else.
func (l *PassthroughListener) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if isTemporary(err) && !l.isClosed() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				timer := time.NewTimer(backoff)
				select {
				case <-timer.C:
				case <-l.done:
					timer.Stop()
				}
				continue
			}
			l.fail(err)
			return
		}
		backoff = 0
		if !l.track(c) || !l.opts.Go(func() { l.route(c) }) {
			l.untrack(c)
			_ = c.Close()
		}
	}
}

func (l *PassthroughListener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// track adds c to the connections Close closes; false once closed.
func (l *PassthroughListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

// untrack takes c off that list; false if Close closed it meanwhile.
func (l *PassthroughListener) untrack(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.pending[c]
	delete(l.pending, c)
	return ok
}

// route reads c's ClientHello and carries c to its tls pool, or hands it to Accept.
func (l *PassthroughListener) route(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(l.opts.HelloTimeout))
	hello, name, err := readClientHello(c)
	if !l.untrack(c) || err != nil {
		// Closed by Close, or the client sent no complete first record in time (or went).
		l.h.cfg.Logger.Debug("HTTPS connection closed before its ClientHello",
			zap.String("remote", c.RemoteAddr().String()), zap.Error(err))
		_ = c.Close()
		return
	}
	if g, sub := l.tlsPool(name); g != nil {
		l.carry(c, hello, g, sub)
		return
	}
	_ = c.SetReadDeadline(time.Time{}) // the TLS server sets its own handshake deadline
	rc := &replayConn{Conn: c, head: hello}
	select {
	case l.ready <- rc:
	case <-l.done:
		_ = c.Close()
	}
}

// tlsPool returns the tls pool that a ClientHello's server name is the route of, if any.
func (l *PassthroughListener) tlsPool(name string) (*group.Group, string) { return l.h.tlsPool(name) }

// tlsPool returns the tls pool that a TLS server name is the route of, if any, and its
// subdomain.
func (h *HTTP) tlsPool(name string) (*group.Group, string) {
	if name == "" || strings.ContainsRune(name, ':') {
		return nil, ""
	}
	sub, ok := subdomainOf(name, h.cfg.Domain) // case and a trailing dot do not matter
	if !ok {
		return nil, ""
	}
	if g := h.cfg.Registry.LookupHTTP(sub); g != nil && g.Proto == group.ProtoTLS {
		return g, sub
	}
	return nil, ""
}

// PassthroughName reports whether serverName, from a TLS ClientHello, names a tls pool. The
// edge's own TLS server refuses such a handshake: a passthrough tunnel's TLS is never
// terminated at the edge, whatever reached that server (a ClientHello the router could not
// read, a pool registered while the router read it).
func (h *HTTP) PassthroughName(serverName string) bool {
	g, _ := h.tlsPool(serverName)
	return g != nil
}

// carry carries c, whose first bytes were hello, to one member of g, as the TCP ingress
// carries a connection: the reserved endpoint's policy of sub, if any, admits it; no
// selectable member (or a refusal) closes it.
func (l *PassthroughListener) carry(c net.Conn, hello []byte, g *group.Group, sub string) {
	cfg := &l.h.cfg
	if l.opts.Connections != nil {
		l.opts.Connections.Add(1)
	}
	remote := c.RemoteAddr().String()
	if cfg.HTTPGate != nil {
		if gate := cfg.HTTPGate(sub); gate != nil {
			done, refused := gate.Admit(clientAddr(remote))
			if refused != nil {
				cfg.Logger.Debug("TLS passthrough connection refused by the endpoint's policy",
					zap.String("subdomain", sub), zap.String("why", refused.Reason))
				_ = c.Close()
				return
			}
			defer done()
		}
	}
	st, m, err := connectMember(cfg, g, remote)
	if err != nil {
		cfg.Logger.Debug("TLS passthrough connection refused", zap.String("subdomain", sub), zap.Error(err))
		_ = c.Close()
		return
	}
	defer m.Release()
	_ = c.SetReadDeadline(time.Time{})
	// The ClientHello first (the stream's window takes it whole), then both ways.
	tun := m.Value().(*Tunnel)
	if _, err := st.Write(hello); err != nil {
		tun.abandon(st)
		_ = c.Close()
		return
	}
	mux.Join(tun.ctx, c, tun.Joinable(st))
}

// replayConn reads head before the connection's own bytes: the ClientHello that the
// router read.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		if len(c.head) == 0 {
			c.head = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// errNotTLS is serverName's answer to bytes that are no ClientHello, or one cut short.
var errNotTLS = errors.New("proxy: not a TLS handshake record")

// readClientHello reads the TLS records of r that carry its first handshake message, the
// ClientHello, and returns every byte it read and the server name of that ClientHello. It
// stops, with the name "", at a record that cannot belong to a ClientHello (not a handshake
// record: then only its 5-byte header is read), at a first message that is no ClientHello,
// or once the ClientHello is over maxClientHello bytes or would take more than
// MaxClientHelloRead bytes to read. A read error (a deadline, the client's end) is returned
// as is.
func readClientHello(r io.Reader) ([]byte, string, error) {
	var raw, msg []byte // every byte read; the handshake messages reassembled from the records
	for {
		start := len(raw)
		if start+tlsRecordHeaderLen > MaxClientHelloRead {
			return raw, "", nil
		}
		raw = slices.Grow(raw, tlsRecordHeaderLen)[:start+tlsRecordHeaderLen]
		if _, err := io.ReadFull(r, raw[start:]); err != nil {
			if start == 0 {
				return nil, "", err
			}
			return nil, "", fmt.Errorf("proxy: reading the ClientHello: %w", err)
		}
		hdr := raw[start:]
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		if hdr[0] != tlsRecordHandshake || hdr[1] != 3 || n == 0 || n > maxTLSRecord || len(raw)+n > MaxClientHelloRead {
			return raw, "", nil
		}
		raw = slices.Grow(raw, n)[:len(raw)+n]
		frag := raw[len(raw)-n:]
		if _, err := io.ReadFull(r, frag); err != nil {
			return nil, "", fmt.Errorf("proxy: reading the ClientHello: %w", err)
		}
		if msg == nil {
			// Most ClientHellos come in one record: read in place, no copy. (Capped: a
			// second record's append copies rather than write into raw.)
			msg = frag[:n:n]
		} else {
			msg = append(msg, frag...)
		}
		if len(msg) < 4 {
			continue
		}
		if msg[0] != tlsHandshakeHello {
			return raw, "", nil
		}
		size := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
		if size > maxClientHello {
			return raw, "", nil
		}
		if len(msg) >= size {
			name, _ := serverName(msg[:size])
			return raw, name, nil
		}
	}
}

// serverName returns the host name of the server_name extension (RFC 6066) of the
// ClientHello at the start of a handshake record's payload, lower-cased and without a
// trailing dot. It fails (errNotTLS) on anything malformed or cut short.
func serverName(b []byte) (string, error) {
	exts, ok := helloExtensions(b)
	if !ok {
		return "", errNotTLS
	}
	for len(exts) > 0 {
		typ, ok1 := exts.uint(2)
		data, ok2 := exts.vector(2)
		if !ok1 || !ok2 {
			return "", errNotTLS
		}
		if typ == tlsExtServerName {
			return sniHostName(data)
		}
	}
	return "", nil
}

// helloExtensions returns the extensions of the ClientHello at the start of b, the payload
// of a handshake record (none when it has none, as TLS 1.0-1.2 allow); ok is false when
// the ClientHello is malformed or cut short.
func helloExtensions(b []byte) (exts helloParser, ok bool) {
	p := helloParser(b)
	typ, ok := p.uint(1)
	if !ok || typ != tlsHandshakeHello {
		return nil, false
	}
	body, ok := p.vector(3)
	if !ok {
		return nil, false // split over records, or longer than its record
	}
	var sessionID, suites, compression helloParser
	if _, ok := body.bytes(2 + 32); !ok { // legacy_version, random
		return nil, false
	}
	if sessionID, ok = body.vector(1); !ok || len(sessionID) > 32 {
		return nil, false
	}
	if suites, ok = body.vector(2); !ok || len(suites) < 2 || len(suites)%2 != 0 {
		return nil, false
	}
	if compression, ok = body.vector(1); !ok || len(compression) < 1 {
		return nil, false
	}
	if len(body) == 0 {
		return nil, true
	}
	if exts, ok = body.vector(2); !ok || len(body) != 0 {
		return nil, false
	}
	return exts, true
}

// sniHostName returns the host name in data, the payload of a server_name extension: the
// first name of type host_name, lower-cased and without a trailing dot, or "" when the list
// has none. It fails (errNotTLS) on a malformed list.
func sniHostName(data helloParser) (string, error) {
	list, ok := data.vector(2)
	if !ok || len(data) != 0 {
		return "", errNotTLS
	}
	for len(list) > 0 {
		nameType, ok1 := list.uint(1)
		name, ok2 := list.vector(2)
		if !ok1 || !ok2 {
			return "", errNotTLS
		}
		if nameType == tlsServerNameHostName {
			if len(name) == 0 || len(name) > 255 {
				return "", errNotTLS
			}
			return strings.ToLower(strings.TrimSuffix(string(name), ".")), nil
		}
	}
	return "", nil
}

// helloParser reads big-endian integers and length-prefixed vectors off a byte slice.
type helloParser []byte

func (p *helloParser) bytes(n int) ([]byte, bool) {
	if n < 0 || len(*p) < n {
		return nil, false
	}
	b := (*p)[:n]
	*p = (*p)[n:]
	return b, true
}

func (p *helloParser) uint(n int) (int, bool) {
	b, ok := p.bytes(n)
	if !ok {
		return 0, false
	}
	v := 0
	for _, c := range b {
		v = v<<8 | int(c)
	}
	return v, true
}

// vector reads a vector whose length takes lenBytes bytes.
func (p *helloParser) vector(lenBytes int) (helloParser, bool) {
	n, ok := p.uint(lenBytes)
	if !ok {
		return nil, false
	}
	b, ok := p.bytes(n)
	return helloParser(b), ok
}

// GuardTLSRoutes returns h answering 421 (Misdirected Request) to an HTTP request whose Host
// is a tls pool's: such a pool is reached only by a TLS connection whose ClientHello names
// it (PassthroughListener), never through the edge's HTTP server. 421 makes an HTTP/2 client
// that reused a connection to another subdomain of the edge for it connect again.
func (h *HTTP) GuardTLSRoutes() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The route found here is handed on: ServeHTTP does not look it up again.
		if r.Method == http.MethodConnect {
			h.serve(w, r, nil) // refused there (405), whatever the Host
			return
		}
		var rt routed
		if rt.sub, rt.ok = subdomainOf(r.Host, h.cfg.Domain); rt.ok {
			rt.g = h.cfg.Registry.LookupHTTP(rt.sub)
			if g := rt.g; g != nil && g.Proto == group.ProtoTLS {
				h.fail(w, r, fmt.Sprintf("%s is a TLS passthrough tunnel: connect to the HTTPS port with TLS and server name %s.%s",
					rt.sub, rt.sub, h.cfg.Domain), http.StatusMisdirectedRequest)
				return
			}
		}
		h.serve(w, r, &rt)
	})
}
