package tunnel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/testlink"
)

// heldLink is the connector's end of its connection to the edge (testlink.Held).
type heldLink = testlink.Held

func newHeldLink(c net.Conn) *heldLink { return testlink.NewHeld(c) }

// heldDialer dials the edge over loopback and hands out the links it made.
type heldDialer struct {
	mu    sync.Mutex
	links []*heldLink
}

func (d *heldDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	l := newHeldLink(c)
	d.mu.Lock()
	d.links = append(d.links, l)
	d.mu.Unlock()
	return l, nil
}

func (d *heldDialer) hold(on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.links {
		l.Hold(on)
	}
}

// TestRequestReachesTheBackendBeforeTheAck: through a real connector, a request on a new
// member stream reaches the backend while the connector's acknowledgement is still on its
// way back to the edge (held here, as a long link would delay it): a request on a new
// stream costs one round trip between edge and connector, not two. A body longer than the
// 64 KiB the edge holds before the acknowledgement arrives whole after it.
func TestRequestReachesTheBackendBeforeTheAck(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	arrived := make(chan string, 4)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Method
		// Not kept alive: each request goes on a new member stream.
		w.Header().Set("Connection", "close")
		sum := sha256.New()
		n, err := io.Copy(sum, r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "%d %x", n, sum.Sum(nil))
	}))
	defer be.Close()
	var d heldDialer
	_, err := e.connect(WithDialer(d.dial)).Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)

	big := bytes.Repeat([]byte("warren!!"), 200<<10/8)
	for _, body := range [][]byte{nil, []byte("small"), big} {
		t.Run(fmt.Sprintf("body of %d bytes", len(body)), func(t *testing.T) {
			// A fresh public connection, and a fresh member stream (the backend closes
			// its connection after each answer).
			client := publicClient(e.publicAddr)
			defer client.CloseIdleConnections()
			d.hold(true)
			type result struct {
				code int
				body string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, e.url("app", "/"), bytes.NewReader(body))
				req.Header.Set("Connection", "close")
				resp, err := client.Do(req)
				if err != nil {
					done <- result{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- result{resp.StatusCode, string(b), err}
			}()
			select {
			case <-arrived:
			case r := <-done:
				t.Fatalf("answered while the acknowledgement was held: %+v", r)
			case <-time.After(5 * time.Second):
				t.Fatal("the request did not reach the backend while the acknowledgement was held")
			}
			d.hold(false)
			r := <-done
			require.NoError(t, r.err)
			require.Equal(t, http.StatusOK, r.code, r.body)
			require.Equal(t, fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)), r.body)
		})
	}
}

// TestRefusedStreamNeverReachesTheApp: a member whose in-process listener does not accept a
// stream in time refuses it; the request, sent behind the envelope before that refusal, goes
// whole to the other member, and the listener never sees it.
func TestRefusedStreamNeverReachesTheApp(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	var served atomic.Int64
	sums := make(chan string, 64)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		sum := sha256.New()
		_, _ = io.Copy(sum, r.Body)
		sums <- fmt.Sprintf("%x", sum.Sum(nil))
		_, _ = io.WriteString(w, "live")
	}))
	defer live.Close()
	// Never accepts: each stream to it is refused after 50 ms.
	ln, err := e.connect(WithLocalTimeout(50*time.Millisecond)).Listen(ctxT(t), pool("pool"))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(live.URL))
	require.NoError(t, err)

	body := bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16) // over the 64 KiB held
	want := fmt.Sprintf("%x", sha256.Sum256(body))
	for i := 0; e.retries.open.Load() == 0; i++ {
		require.Less(t, i, 20, "no request picked the refusing member")
		resp, err := e.client.Post(e.url("pool", "/"), "text/plain", bytes.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		require.Equal(t, "live", string(b))
		require.Equal(t, want, <-sums, "the live backend got the whole body")
	}
	// The refused stream was never handed to the listener: Accept has nothing to return.
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			b, _ := io.ReadAll(c)
			_ = c.Close()
			err = fmt.Errorf("accepted a stream carrying %q", strings.TrimSpace(string(b)))
			accepted <- err
			return
		}
		accepted <- nil
	}()
	require.NoError(t, ln.Close())
	require.NoError(t, <-accepted)
}

// delayLink delays each direction of a connector's connection to the edge by one way's
// delay, as a long link does (the round trip between edge and connector is twice that).
type delayLink struct {
	net.Conn
	oneWay time.Duration
	out    chan delayed // connector to edge
	in     chan delayed // edge to connector
	rest   []byte       // of the chunk being read
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

type delayed struct {
	due time.Time
	b   []byte
}

func newDelayLink(c net.Conn, oneWay time.Duration) *delayLink {
	l := &delayLink{Conn: c, oneWay: oneWay, out: make(chan delayed, 4096), in: make(chan delayed, 4096), done: make(chan struct{})}
	l.wg.Go(func() { // writes, each when due
		for {
			select {
			case d := <-l.out:
				time.Sleep(time.Until(d.due))
				if _, err := l.Conn.Write(d.b); err != nil {
					return
				}
			case <-l.done:
				return
			}
		}
	})
	l.wg.Go(func() { // reads, each handed on when due
		defer close(l.in)
		for {
			b := make([]byte, 64<<10)
			n, err := l.Conn.Read(b)
			if n > 0 {
				select {
				case l.in <- delayed{time.Now().Add(oneWay), b[:n]}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return l
}

func (l *delayLink) Write(p []byte) (int, error) {
	select {
	case l.out <- delayed{time.Now().Add(l.oneWay), bytes.Clone(p)}:
		return len(p), nil
	case <-l.done:
		return 0, net.ErrClosed
	}
}

func (l *delayLink) Read(p []byte) (int, error) {
	if len(l.rest) == 0 {
		d, ok := <-l.in
		if !ok {
			return 0, io.EOF
		}
		time.Sleep(time.Until(d.due))
		l.rest = d.b
	}
	n := copy(p, l.rest)
	l.rest = l.rest[n:]
	return n, nil
}

func (l *delayLink) Close() error {
	l.once.Do(func() { close(l.done) })
	err := l.Conn.Close()
	l.wg.Wait()
	return err
}

// BenchmarkNewStreamRequestOverDelayedLink measures one request on a new member stream (the
// backend closes its connection after each answer) when the link between edge and
// connector has a round trip of 20 ms; the public client and the backend are near. The
// time per request is about one round trip: the request goes behind the stream's envelope,
// without waiting for the connector's acknowledgement (two round trips before).
func BenchmarkNewStreamRequestOverDelayedLink(b *testing.B) {
	const oneWay = 10 * time.Millisecond
	e := startEdge(b, ServerConfig{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "ok")
	}))
	b.Cleanup(be.Close)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newDelayLink(c, oneWay), nil
	}
	_, err := e.connect(WithDialer(dial)).Forward(ctxT(b), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(b, err)
	for b.Loop() {
		resp, err := e.client.Get(e.url("app", "/"))
		require.NoError(b, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/req")
}
