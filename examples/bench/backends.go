package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/warren-tunnel/warren/tunnel"
)

// reqIDHeader carries a request's number, so that a backend can say which requests reached
// it (churn scenario).
const reqIDHeader = "X-Bench-Req"

var (
	tinyBody    = []byte("ok\n")
	payload64k  = bytes.Repeat([]byte("0123456789abcdef"), 64<<10/16)
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
	errBadReply = errors.New("bad checksum reply")
)

// httpBackend is a plain net/http server on loopback: /64k answers 64 KiB, anything else a
// 3-byte body. It can be killed (listener and every connection closed at once) and started
// again on the same address.
type httpBackend struct {
	addr   string
	record bool // keep the ids of the requests each instance received
	h2c    bool // serve HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1

	mu   sync.Mutex
	cur  *backendInstance
	past []*backendInstance
}

// backendInstance is one life of an httpBackend, between start and kill.
type backendInstance struct {
	srv    *http.Server
	done   chan struct{} // closed when Serve has returned
	record bool

	mu   sync.Mutex
	seen []string // request ids received, in order
}

func (in *backendInstance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if in.record {
		if id := r.Header.Get(reqIDHeader); id != "" {
			in.mu.Lock()
			in.seen = append(in.seen, id)
			in.mu.Unlock()
		}
	}
	body := tinyBody
	if r.URL.Path == "/64k" {
		body = payload64k
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	_, _ = w.Write(body)
}

// seenIDs returns the request ids the instance received.
func (in *backendInstance) seenIDs() map[string]bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	m := make(map[string]bool, len(in.seen))
	for _, id := range in.seen {
		m[id] = true
	}
	return m
}

// start serves on addr ("127.0.0.1:0" for a fresh port, or the address of a killed life).
func (b *httpBackend) start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("backend on %s: %w", addr, err)
	}
	in := &backendInstance{done: make(chan struct{}), record: b.record}
	in.srv = &http.Server{Handler: in, ReadHeaderTimeout: 10 * time.Second}
	if b.h2c {
		in.srv.Protocols = new(http.Protocols)
		in.srv.Protocols.SetHTTP1(true)
		in.srv.Protocols.SetUnencryptedHTTP2(true)
	}
	b.mu.Lock()
	b.addr, b.cur = ln.Addr().String(), in
	b.mu.Unlock()
	go func() { defer close(in.done); _ = in.srv.Serve(ln) }() // owned: kill waits for it
	return nil
}

// kill closes the listener and every connection at once, without letting in-flight requests
// finish, and returns the life that ended (nil if it was not running).
func (b *httpBackend) kill() *backendInstance {
	b.mu.Lock()
	in := b.cur
	b.cur = nil
	if in != nil {
		b.past = append(b.past, in)
	}
	b.mu.Unlock()
	if in != nil {
		_ = in.srv.Close()
		<-in.done
	}
	return in
}

// startHTTPBackends starts n backends on fresh loopback ports.
func startHTTPBackends(n int, record bool) ([]*httpBackend, error) {
	return startBackends(n, record, false)
}

// startH2CBackends starts n backends that serve h2c (HTTP/2 with prior knowledge) as well as
// HTTP/1.1 on fresh loopback ports.
func startH2CBackends(n int) ([]*httpBackend, error) {
	return startBackends(n, false, true)
}

func startBackends(n int, record, h2c bool) ([]*httpBackend, error) {
	var bs []*httpBackend
	for range n {
		b := &httpBackend{record: record, h2c: h2c}
		if err := b.start("127.0.0.1:0"); err != nil {
			stopHTTPBackends(bs)
			return nil, err
		}
		bs = append(bs, b)
	}
	return bs, nil
}

func stopHTTPBackends(bs []*httpBackend) {
	for _, b := range bs {
		b.kill()
	}
}

// tcpBackend accepts TCP connections on loopback and runs handle on each.
type tcpBackend struct {
	ln     net.Listener
	handle func(net.Conn)
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startTCPBackend(handle func(net.Conn)) (*tcpBackend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &tcpBackend{ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.accept)
	return b, nil
}

func (b *tcpBackend) addr() string { return b.ln.Addr().String() }

func (b *tcpBackend) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		b.wg.Go(func() {
			defer func() {
				b.mu.Lock()
				delete(b.conns, c)
				b.mu.Unlock()
				_ = c.Close()
			}()
			b.handle(c)
		})
	}
}

// Close stops accepting, closes every connection and waits for the handlers.
func (b *tcpBackend) Close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// readerOnly hides a conn's WriteTo so that io.CopyBuffer uses the given buffer.
type readerOnly struct{ io.Reader }

// writerOnly hides a conn's ReadFrom (splice on Linux) so that io.CopyBuffer copies through
// the given buffer.
type writerOnly struct{ io.Writer }

// relayConn connects c to target and copies both ways through 64 KiB user-space buffers (no
// splice), as any relay that frames or inspects the bytes must: two of them in a row are the
// tunnel's topology without Warren.
func relayConn(target string) func(net.Conn) {
	return func(c net.Conn) {
		u, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			return
		}
		defer u.Close()
		done := make(chan struct{})
		go func() { // owned: waited for below
			defer close(done)
			_, _ = io.CopyBuffer(writerOnly{u}, readerOnly{c}, make([]byte, 64<<10))
			_ = u.(*net.TCPConn).CloseWrite()
		}()
		_, _ = io.CopyBuffer(writerOnly{c}, readerOnly{u}, make([]byte, 64<<10))
		_ = c.(*net.TCPConn).CloseWrite()
		<-done
	}
}

// hashConn reads until the client half-closes, hashing with CRC-32C (hardware accelerated),
// then answers with the byte count (8 bytes) and the checksum (4 bytes), big-endian.
func hashConn(c net.Conn) {
	h := crc32.New(castagnoli)
	n, err := io.CopyBuffer(h, readerOnly{c}, make([]byte, 256<<10))
	if err != nil {
		return
	}
	var out [12]byte
	binary.BigEndian.PutUint64(out[:8], uint64(n))
	binary.BigEndian.PutUint32(out[8:], h.Sum32())
	_, _ = c.Write(out[:])
}

// maxSizedStream bounds the length a sized stream may announce (hashSizedConn).
const maxSizedStream = 1 << 40

// hashSizedConn is hashConn for relays that do not pass a half-close on (frp's TCP proxies
// close both directions when one ends): the client first sends the stream's length (8 bytes,
// big-endian), then that many bytes; the answer is hashConn's, and the connection stays
// open until the client closes it.
func hashSizedConn(c net.Conn) {
	var head [8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return
	}
	size := binary.BigEndian.Uint64(head[:])
	if size > maxSizedStream {
		return
	}
	h := crc32.New(castagnoli)
	n, err := io.CopyBuffer(h, io.LimitReader(readerOnly{c}, int64(size)), make([]byte, 256<<10))
	if err != nil {
		return
	}
	var out [12]byte
	binary.BigEndian.PutUint64(out[:8], uint64(n))
	binary.BigEndian.PutUint32(out[8:], h.Sum32())
	if _, err := c.Write(out[:]); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// oneByteConn writes one byte on accept, then waits for the client to close.
func oneByteConn(c net.Conn) {
	if _, err := c.Write([]byte{'!'}); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

func startTCPBackends(n int, handle func(net.Conn)) ([]*tcpBackend, error) {
	var bs []*tcpBackend
	for range n {
		b, err := startTCPBackend(handle)
		if err != nil {
			stopTCPBackends(bs)
			return nil, err
		}
		bs = append(bs, b)
	}
	return bs, nil
}

func stopTCPBackends(bs []*tcpBackend) {
	for _, b := range bs {
		b.Close()
	}
}

// connectors are connector sessions, each with one tunnel, all in one group.
type connectors struct {
	sessions []*tunnel.Session
	tunnels  []*tunnel.Tunnel
	specs    []tunnel.TunnelSpec
	targets  []string
}

// connectGroup dials one connector per target and forwards spec to it.
func connectGroup(ctx context.Context, e *edge, spec tunnel.TunnelSpec, targets []string, log *zap.Logger) (*connectors, error) {
	cs := &connectors{}
	for _, target := range targets {
		sess, err := tunnel.Dial(ctx, e.Control, tunnel.WithLogger(log))
		if err != nil {
			_ = cs.Close()
			return nil, err
		}
		cs.sessions = append(cs.sessions, sess)
		t, err := sess.Forward(ctx, spec, target)
		if err != nil {
			_ = cs.Close()
			return nil, err
		}
		cs.tunnels, cs.specs, cs.targets = append(cs.tunnels, t), append(cs.specs, spec), append(cs.targets, target)
	}
	return cs, nil
}

// Close closes every session (each drains its tunnel) concurrently.
func (cs *connectors) Close() error {
	var g errgroup.Group
	for _, s := range cs.sessions {
		g.Go(s.Close)
	}
	return g.Wait()
}
