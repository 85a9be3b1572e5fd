package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// backend is a fake member backend behind a fake connector: it counts the requests that
// reached it and keeps their bodies.
type backend struct {
	hits   atomic.Int64
	mu     sync.Mutex
	bodies [][]byte
}

// read reads one request and its whole body from br and records them; ok is false when the
// stream ended instead.
func (b *backend) read(br *bufio.Reader) (req *http.Request, ok bool) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, false
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, false
	}
	b.mu.Lock()
	b.bodies = append(b.bodies, body)
	b.mu.Unlock()
	b.hits.Add(1)
	return req, true
}

// lastBody returns the body of the last request that reached the backend.
func (b *backend) lastBody() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bodies) == 0 {
		return nil
	}
	return b.bodies[len(b.bodies)-1]
}

// answer answers every request with 200 and the tunnel id as the body.
func (b *backend) answer(_ *connector, st mux.Stream, env wire.Envelope) {
	br := bufio.NewReader(st)
	for {
		if _, ok := b.read(br); !ok {
			return
		}
		if _, err := fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(env.TunnelID), env.TunnelID); err != nil {
			return
		}
	}
}

// reply reads one request (and its body), writes raw, which may be nothing, a part of a
// response or a whole one, and ends the stream, as a backend that closes its connection
// does.
func (b *backend) reply(raw string) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		if _, ok := b.read(bufio.NewReader(st)); ok && raw != "" {
			_, _ = io.WriteString(st, raw)
		}
	}
}

// retryEdge is an HTTP ingress in front of group "pool": a member "bad" whose backend
// misbehaves as told and a member "good" that answers every request with "good".
type retryEdge struct {
	h         *HTTP
	stats     Stats
	bad, good *backend
}

func startRetryEdge(t *testing.T, cfg Config, bad func(b *backend) func(*connector, mux.Stream, wire.Envelope)) *retryEdge {
	t.Helper()
	e := &retryEdge{stats: newStats(), bad: &backend{}, good: &backend{}}
	e.stats.RetriesIdempotent = new(atomic.Uint64)
	cfg.Registry = group.NewRegistry(group.Config{LoadBalancing: true})
	cfg.Domain, cfg.Stats = testDomain, e.stats
	join(t, cfg.Registry, "bad", group.ProtoHTTP, startConnector(t, wire.AckOK, bad(e.bad)))
	join(t, cfg.Registry, "good", group.ProtoHTTP, startConnector(t, wire.AckOK, e.good.answer))
	e.h = NewHTTP(cfg)
	return e
}

// request returns a request to the pool; a non-nil body is sent with its length, or
// chunked when chunked is true.
func request(method string, body []byte, chunked bool) *http.Request {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req := httptest.NewRequest(method, "http://pool."+testDomain+"/", r)
	if chunked {
		req.ContentLength = -1
	}
	return req
}

// untilBad sends requests made by newReq until one reaches the bad member's backend, and
// returns the answer to that one and how many times the good member's backend received it.
// The requests before it must have been answered by the good member.
func (e *retryEdge) untilBad(t *testing.T, newReq func() *http.Request) (*httptest.ResponseRecorder, int64) {
	t.Helper()
	for range 20 {
		bad, good := e.bad.hits.Load(), e.good.hits.Load()
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, newReq())
		if e.bad.hits.Load() > bad {
			require.Equal(t, bad+1, e.bad.hits.Load())
			return rec, e.good.hits.Load() - good
		}
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, "good", rec.Body.String())
	}
	t.Fatal("no request reached the bad member")
	return nil, 0
}

func retryAll(*group.Group) bool { return true }

// TestRetryIdempotent: with Config.RetryIdempotent on for the group, a replayable request
// whose member fails before any response byte arrived goes to the other member, once, with
// the same body; requests that are not replayable, or whose response had begun, are not
// sent again.
func TestRetryIdempotent(t *testing.T) {
	dropping := func(b *backend) func(*connector, mux.Stream, wire.Envelope) { return b.reply("") }

	t.Run("GET whose backend closes without answering", func(t *testing.T) {
		e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, dropping)
		rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodGet, nil, false) })
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, "good", rec.Body.String())
		require.Equal(t, int64(1), good, "the good member got the retry")
		require.Equal(t, uint64(1), e.stats.RetriesIdempotent.Load())
		require.Zero(t, e.stats.RetriesResetUnread.Load())
		require.Zero(t, e.stats.RetriesOpenFailed.Load())
	})

	for name, cfg := range map[string]Config{
		"rule off (nil)":          {},
		"rule off for this group": {RetryIdempotent: func(g *group.Group) bool { return g.Label != "pool" }},
	} {
		t.Run("GET, "+name, func(t *testing.T) {
			e := startRetryEdge(t, cfg, dropping)
			rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodGet, nil, false) })
			require.Equal(t, http.StatusBadGateway, rec.Code)
			require.Zero(t, good)
			require.Zero(t, e.stats.RetriesIdempotent.Load())
		})
	}

	t.Run("POST without Idempotency-Key", func(t *testing.T) {
		e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, dropping)
		body := []byte("charge the card")
		rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodPost, body, false) })
		require.Equal(t, http.StatusBadGateway, rec.Code)
		require.Zero(t, e.stats.RetriesIdempotent.Load())
		require.Zero(t, good, "the good member never saw it")
		require.Equal(t, body, e.bad.lastBody())
	})

	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("POST with Idempotency-Key, chunked=%v", chunked), func(t *testing.T) {
			e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, dropping)
			body := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // exactly 64 KiB: the largest replayable body
			rec, good := e.untilBad(t, func() *http.Request {
				req := request(http.MethodPost, body, chunked)
				req.Header.Set("Idempotency-Key", "order-42")
				return req
			})
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			require.Equal(t, "good", rec.Body.String())
			require.Equal(t, int64(1), good)
			require.Equal(t, uint64(1), e.stats.RetriesIdempotent.Load())
			require.Equal(t, body, e.bad.lastBody(), "the first member got the whole body")
			require.Equal(t, body, e.good.lastBody(), "the second member got the identical body")
		})
	}

	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("PUT of 100 KiB, chunked=%v", chunked), func(t *testing.T) {
			e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, dropping)
			body := bytes.Repeat([]byte("x"), 100<<10)
			body[0], body[len(body)-1] = 'a', 'z'
			rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodPut, body, chunked) })
			require.Equal(t, http.StatusBadGateway, rec.Code, "over 64 KiB: not replayable")
			require.Zero(t, e.stats.RetriesIdempotent.Load())
			require.Zero(t, good)
			require.Equal(t, body, e.bad.lastBody(), "the backend received all 100 KiB")
		})
	}

	t.Run("response head arrived", func(t *testing.T) {
		e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, func(b *backend) func(*connector, mux.Stream, wire.Envelope) {
			return b.reply("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
		})
		rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodGet, nil, false) })
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "partial", rec.Body.String(), "the cut response, not a replay")
		require.Zero(t, good)
		require.Zero(t, e.stats.RetriesIdempotent.Load())
	})

	t.Run("part of a response head arrived", func(t *testing.T) {
		e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, func(b *backend) func(*connector, mux.Stream, wire.Envelope) {
			return b.reply("HTTP/1.1 20")
		})
		rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodGet, nil, false) })
		require.Equal(t, http.StatusBadGateway, rec.Code)
		require.Zero(t, good)
		require.Zero(t, e.stats.RetriesIdempotent.Load())
	})

	t.Run("client gone", func(t *testing.T) {
		got := make(chan struct{}, 1)
		e := startRetryEdge(t, Config{RetryIdempotent: retryAll}, func(b *backend) func(*connector, mux.Stream, wire.Envelope) {
			return func(_ *connector, st mux.Stream, _ wire.Envelope) {
				if _, ok := b.read(bufio.NewReader(st)); ok {
					got <- struct{}{}
					_, _ = io.Copy(io.Discard, st) // until the edge closes the stream
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-got:
				cancel()
			case <-ctx.Done():
			}
		}()
		rec, good := e.untilBad(t, func() *http.Request { return request(http.MethodGet, nil, false).WithContext(ctx) })
		require.Equal(t, http.StatusBadGateway, rec.Code)
		require.Zero(t, e.stats.RetriesIdempotent.Load())
		require.Zero(t, good, "not sent again for a client that left")
	})

	t.Run("one retry in all", func(t *testing.T) {
		// Both members drop the request: the second failure is final.
		stats := newStats()
		stats.RetriesIdempotent = new(atomic.Uint64)
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		var a, b backend
		join(t, reg, "a", group.ProtoHTTP, startConnector(t, wire.AckOK, a.reply("")))
		join(t, reg, "b", group.ProtoHTTP, startConnector(t, wire.AckOK, b.reply("")))
		h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, RetryIdempotent: retryAll})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(http.MethodDelete, nil, false))
		require.Equal(t, http.StatusBadGateway, rec.Code)
		require.Equal(t, uint64(1), stats.RetriesIdempotent.Load())
		require.Equal(t, int64(1), a.hits.Load())
		require.Equal(t, int64(1), b.hits.Load())
	})

	t.Run("refused open spends the retry", func(t *testing.T) {
		// The first pick's open is refused and the retry goes to a member that drops the
		// request: no third member is tried.
		stats := newStats()
		stats.RetriesIdempotent = new(atomic.Uint64)
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		var drop, good backend
		refusing := startConnector(t, wire.AckRefused, nil)
		join(t, reg, "refusing", group.ProtoHTTP, refusing)
		join(t, reg, "drop", group.ProtoHTTP, startConnector(t, wire.AckOK, drop.reply("")))
		join(t, reg, "good", group.ProtoHTTP, startConnector(t, wire.AckOK, good.answer))
		h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, RetryIdempotent: retryAll})
		for range 30 {
			rec := httptest.NewRecorder()
			r0, d0, g0 := refusing.streams.Load(), drop.hits.Load(), good.hits.Load()
			h.ServeHTTP(rec, request(http.MethodGet, nil, false))
			attempts := (refusing.streams.Load() - r0) + (drop.hits.Load() - d0) + (good.hits.Load() - g0)
			require.LessOrEqual(t, attempts, int64(2), "at most one other member per request")
			if refusing.streams.Load() > r0 && drop.hits.Load() > d0 {
				require.Equal(t, http.StatusBadGateway, rec.Code)
				return
			}
		}
		t.Fatal("the refused member was never followed by the dropping one")
	})
}

// TestRetryIdempotentBodyLimits: buffering a replayable body keeps the public body's limits:
// a body over RequestBodyMaxBytes gets 413 and reaches no member.
func TestRetryIdempotentBodyLimits(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			e := startRetryEdge(t, Config{RetryIdempotent: retryAll, RequestBodyMaxBytes: 1000},
				func(b *backend) func(*connector, mux.Stream, wire.Envelope) { return b.answer })
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, request(http.MethodPut, bytes.Repeat([]byte("x"), 5000), chunked))
			require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
			require.Zero(t, e.bad.hits.Load()+e.good.hits.Load())
		})
	}
}

// outcome is one Config.Outcome call.
type outcome struct {
	member string
	failed bool
	reason string
}

// outcomes records Config.Outcome calls.
type outcomes struct {
	mu  sync.Mutex
	got []outcome
}

func (o *outcomes) record(m *group.Member, failed bool, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, outcome{m.Value().(*Tunnel).id, failed, reason})
}

func (o *outcomes) take() []outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.got
	o.got = nil
	return got
}

// TestOutcome: each attempt on a member is reported once, failed when the open was refused,
// the stream ended before a response head, the head was malformed or the backend answered
// 502, and not failed otherwise; the TCP ingress reports acknowledged opens.
func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		name   string
		serve  func(b *backend) func(*connector, mux.Stream, wire.Envelope)
		ack    wire.Ack
		code   int
		failed bool
		reason string
	}{
		{"answers", func(b *backend) func(*connector, mux.Stream, wire.Envelope) { return b.answer }, wire.AckOK, http.StatusOK, false, ""},
		{"answers 500", func(b *backend) func(*connector, mux.Stream, wire.Envelope) {
			return b.reply("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
		}, wire.AckOK, http.StatusInternalServerError, false, ""},
		{"answers 502", func(b *backend) func(*connector, mux.Stream, wire.Envelope) {
			return b.reply("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		}, wire.AckOK, http.StatusBadGateway, true, "backend answered 502"},
		{"closes without answering", func(b *backend) func(*connector, mux.Stream, wire.Envelope) { return b.reply("") },
			wire.AckOK, http.StatusBadGateway, true, "reset before a response"},
		{"malformed head", func(b *backend) func(*connector, mux.Stream, wire.Envelope) { return b.reply("SMTP ready\r\n\r\n") },
			wire.AckOK, http.StatusBadGateway, true, "bad response: "},
		{"refuses", nil, wire.AckRefused, http.StatusBadGateway, true, "open refused: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o outcomes
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			var b backend
			var serve func(*connector, mux.Stream, wire.Envelope)
			if tc.serve != nil {
				serve = tc.serve(&b)
			}
			join(t, reg, "m", group.ProtoHTTP, startConnector(t, tc.ack, serve))
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, Outcome: o.record, RetryIdempotent: retryAll})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request(http.MethodGet, nil, false))
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			got := o.take()
			require.Len(t, got, 1, "one attempt, one report: %v", got)
			require.Equal(t, "m", got[0].member)
			require.Equal(t, tc.failed, got[0].failed)
			if tc.reason == "" {
				require.Empty(t, got[0].reason)
			} else {
				require.Contains(t, got[0].reason, tc.reason)
			}
		})
	}

	t.Run("retried", func(t *testing.T) {
		// A refused open, then a member that drops the request: two failed attempts.
		var o outcomes
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		var drop backend
		join(t, reg, "refusing", group.ProtoHTTP, startConnector(t, wire.AckRefused, nil))
		join(t, reg, "drop", group.ProtoHTTP, startConnector(t, wire.AckOK, drop.reply("")))
		h := NewHTTP(Config{Registry: reg, Domain: testDomain, Outcome: o.record})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(http.MethodGet, nil, false))
		require.Equal(t, http.StatusBadGateway, rec.Code)
		got := o.take()
		require.Len(t, got, 2, "%v", got)
		byMember := map[string]outcome{got[0].member: got[0], got[1].member: got[1]}
		require.True(t, byMember["refusing"].failed)
		require.Contains(t, byMember["refusing"].reason, "open refused: ")
		require.Equal(t, outcome{"drop", true, "reset before a response"}, byMember["drop"])
	})

	t.Run("client gone", func(t *testing.T) {
		var o outcomes
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		got := make(chan struct{})
		join(t, reg, "m", group.ProtoHTTP, startConnector(t, wire.AckOK, func(_ *connector, st mux.Stream, _ wire.Envelope) {
			if _, err := http.ReadRequest(bufio.NewReader(st)); err == nil {
				close(got)
				_, _ = io.Copy(io.Discard, st)
			}
		}))
		h := NewHTTP(Config{Registry: reg, Domain: testDomain, Outcome: o.record})
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-got; cancel() }()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(http.MethodGet, nil, false).WithContext(ctx))
		require.Equal(t, http.StatusBadGateway, rec.Code)
		require.Empty(t, o.take(), "nothing is known of the member")
	})

	t.Run("TCP", func(t *testing.T) {
		var o outcomes
		var addr atomic.Value
		tcp := NewTCP(Config{OpenTimeout: 2 * time.Second, Outcome: o.record, ListenTCP: func(int) (net.Listener, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				addr.Store(ln.Addr().String())
			}
			return ln, err
		}})
		defer tcp.Wait()
		defer tcp.Close()
		reg := group.NewRegistry(group.Config{LoadBalancing: true, Ports: group.PortRange{Lo: 40000, Hi: 40000},
			OnCreate: tcp.OnCreate, OnRemove: tcp.OnRemove})
		join(t, reg, "refusing", group.ProtoTCP, startConnector(t, wire.AckRefused, nil))
		join(t, reg, "live", group.ProtoTCP, startConnector(t, wire.AckOK, echo))
		c, err := net.Dial("tcp", addr.Load().(string))
		require.NoError(t, err)
		_, err = io.WriteString(c, "ping")
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 4))
		require.NoError(t, err)
		require.NoError(t, c.Close())
		got := o.take()
		require.NotEmpty(t, got)
		require.Equal(t, outcome{"live", false, ""}, got[len(got)-1], "the acknowledged open")
		if len(got) == 2 {
			require.Equal(t, "refusing", got[0].member)
			require.True(t, got[0].failed)
			require.Contains(t, got[0].reason, "open refused: ")
		} else {
			require.Len(t, got, 1)
		}
	})
}

// TestRetryIdempotentBodyTimeout: a replayable request whose body does not arrive in time
// still gets 408 while the edge buffers it, and no member is sent anything; a body that
// arrives in time is carried whole.
func TestRetryIdempotentBodyTimeout(t *testing.T) {
	e := startBodyEdge(t, Config{RequestBodyTimeout: 300 * time.Millisecond, RetryIdempotent: retryAll}, false)
	const putHead = "PUT /upload HTTP/1.1\r\nHost: pool." + testDomain + "\r\n"

	c, br := e.dial(t)
	start := time.Now()
	_, err := io.WriteString(c, putHead+"Content-Length: 1000\r\n\r\nonly this")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Zero(t, e.c.streams.Load(), "nothing was sent to the member")

	c, br = e.dial(t)
	body := bytes.Repeat([]byte("y"), 1000)
	_, err = io.WriteString(c, putHead+"Content-Length: 1000\r\n\r\n"+string(body))
	require.NoError(t, err)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "1000", string(got))
	require.NoError(t, e.streamEnded(t))
}
