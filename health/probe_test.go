package health

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawServer serves every connection on a loopback listener with handle and
// returns the listener's address. Cleanup closes the listener and every
// connection and waits for all goroutines it started.
func rawServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu       sync.Mutex
		conns    []net.Conn
		handlers sync.WaitGroup
	)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			handlers.Add(1)
			go func() {
				defer handlers.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-acceptDone
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		handlers.Wait()
	})
	return ln.Addr().String()
}

// readRequest consumes the probe's request head.
func readRequest(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil || line == "\r\n" {
			return
		}
	}
}

func TestTCPProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	spec := Spec{Type: TypeTCP, Timeout: time.Second}

	require.NoError(t, spec.Probe(context.Background(), addr))

	require.NoError(t, ln.Close())
	err = spec.Probe(context.Background(), addr)
	require.Error(t, err)
	require.ErrorContains(t, err, "dial tcp "+addr)
}

func TestHTTPProbeSendsMinimalRequest(t *testing.T) {
	type seen struct {
		method, uri, proto, host, ua string
		close                        bool // the request said Connection: close
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Method, r.RequestURI, r.Proto, r.Host, r.UserAgent(), r.Close}
	}))
	t.Cleanup(srv.Close)
	target := srv.Listener.Addr().String()

	spec := Spec{Type: TypeHTTP, Path: "/healthz?deep=1", Timeout: time.Second}
	require.NoError(t, spec.Probe(context.Background(), target))
	require.Equal(t, seen{"GET", "/healthz?deep=1", "HTTP/1.0", target, "warren-health", true}, <-got)
}

func TestHTTPProbeStatus(t *testing.T) {
	for _, tc := range []struct {
		status    int
		anyStatus bool
		wantErr   string
	}{
		{200, false, ""},
		{204, false, ""},
		{299, false, ""},
		{300, false, "health: http status 300"},
		{404, false, "health: http status 404"},
		{500, false, "health: http status 500"},
		{500, true, ""},
		{404, true, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
		}))
		spec := Spec{Type: TypeHTTP, Path: "/", Timeout: time.Second, AnyStatus: tc.anyStatus}
		err := spec.Probe(context.Background(), srv.Listener.Addr().String())
		srv.Close()
		if tc.wantErr == "" {
			require.NoError(t, err, "status %d anyStatus=%v", tc.status, tc.anyStatus)
			continue
		}
		require.ErrorIs(t, err, ErrHTTPStatus, "status %d", tc.status)
		require.EqualError(t, err, tc.wantErr)
	}
}

// TestHTTPProbeRawAnswers covers peers that answer with something other than
// a well-formed response. "hold" peers keep the connection open after their
// answer: the probe must decide from what it has, not wait for the timeout.
func TestHTTPProbeRawAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  string
		hold    bool
		wantIs  error
		wantMsg string
	}{
		{name: "full response", answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{name: "no reason phrase", answer: "HTTP/1.0 204\r\n", hold: true},
		{name: "bare LF", answer: "HTTP/1.1 200 OK\n", hold: true},
		{name: "line cut by close", answer: "HTTP/1.1 200 OK"},
		{name: "bad status", answer: "HTTP/1.1 503 Busy\r\n\r\n", wantIs: ErrHTTPStatus, wantMsg: "health: http status 503"},
		{name: "ssh banner", answer: "SSH-2.0-OpenSSH_9.6\r\n", hold: true, wantIs: ErrMalformedStatusLine, wantMsg: `health: malformed status line "SSH-2.0-OpenSSH_9.6"`},
		{name: "garbage without newline", answer: "garbage", hold: true, wantIs: ErrMalformedStatusLine, wantMsg: `health: malformed status line "garbage"`},
		{name: "binary", answer: "\x00\x01\x02\x03\x04\x05", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "two-digit code", answer: "HTTP/1.1 20 OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "code with letters", answer: "HTTP/1.1 2x0 OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "code out of range", answer: "HTTP/1.1 700 OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "no space after code", answer: "HTTP/1.1 200OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "bad version", answer: "HTTP/x 200 OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "wrong protocol", answer: "HTTPS/1.1 200 OK\r\n", hold: true, wantIs: ErrMalformedStatusLine},
		{name: "closed without answer", answer: "", wantIs: ErrNoStatusLine, wantMsg: "health: no status line: connection closed by peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, func(c net.Conn) {
				readRequest(c)
				_, _ = io.WriteString(c, tc.answer)
				if tc.hold {
					_, _ = io.Copy(io.Discard, c) // until the prober hangs up
				}
			})
			// A long timeout: every case must be decided by what the peer sent.
			spec := Spec{Type: TypeHTTP, Path: "/", Timeout: 30 * time.Second}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := spec.Probe(ctx, addr)
			if tc.wantIs == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantIs)
			if tc.wantMsg != "" {
				require.EqualError(t, err, tc.wantMsg)
			}
		})
	}
}

func TestHTTPProbeQuotesLongGarbageShortly(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) {
		readRequest(c)
		_, _ = io.WriteString(c, strings.Repeat("x", 500)+"\r\n")
		_, _ = io.Copy(io.Discard, c)
	})
	err := Spec{Type: TypeHTTP, Path: "/", Timeout: 30 * time.Second}.Probe(context.Background(), addr)
	require.ErrorIs(t, err, ErrMalformedStatusLine)
	require.Less(t, len(err.Error()), 100, "the peer's bytes are quoted only in part: %v", err)
}

func TestNilContext(t *testing.T) {
	var ctx context.Context // nil
	require.ErrorContains(t, Spec{Type: TypeFunc, Check: okCheck}.Probe(ctx, ""), "nil context")
	p, err := NewProber(Spec{Type: TypeFunc, Check: okCheck}, "", func(Report) {})
	require.NoError(t, err)
	require.ErrorContains(t, p.Run(ctx), "nil context")
}

func TestHTTPProbeTimesOutOnSilentPeer(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	spec := Spec{Type: TypeHTTP, Path: "/", Timeout: 100 * time.Millisecond}

	start := time.Now()
	err := spec.Probe(context.Background(), addr)
	elapsed := time.Since(start)

	require.ErrorIs(t, err, ErrNoStatusLine)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorContains(t, err, "i/o timeout")
	require.GreaterOrEqual(t, elapsed, 90*time.Millisecond)
	require.Less(t, elapsed, 5*time.Second)
}

func TestHTTPProbeEndlessLine(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) {
		readRequest(c)
		chunk := []byte(strings.Repeat("a", 512))
		if _, err := io.WriteString(c, "HTTP/1.1 200 "); err != nil {
			return
		}
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	spec := Spec{Type: TypeHTTP, Path: "/", Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := spec.Probe(ctx, addr)
	require.ErrorIs(t, err, ErrMalformedStatusLine)
	require.EqualError(t, err, "health: malformed status line: no end of line within 1024 bytes")
}

func TestHTTPProbeTricklingLineHitsTimeout(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) {
		readRequest(c)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		if _, err := io.WriteString(c, "HTTP/1.1 200 "); err != nil {
			return
		}
		for range tick.C {
			if _, err := io.WriteString(c, "a"); err != nil {
				return
			}
		}
	})
	spec := Spec{Type: TypeHTTP, Path: "/", Timeout: 100 * time.Millisecond}
	start := time.Now()
	err := spec.Probe(context.Background(), addr)
	require.ErrorIs(t, err, ErrNoStatusLine)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestHTTPProbeStopsOnCancel(t *testing.T) {
	accepted := make(chan struct{}, 1)
	addr := rawServer(t, func(c net.Conn) {
		readRequest(c) // the probe is now waiting for the status line
		accepted <- struct{}{}
		_, _ = io.Copy(io.Discard, c)
	})
	spec := Spec{Type: TypeHTTP, Path: "/", Timeout: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	errc := make(chan error, 1)
	go func() { errc <- spec.Probe(ctx, addr) }()
	<-accepted
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrNoStatusLine)
	case <-time.After(5 * time.Second):
		t.Fatal("Probe did not return after its context was cancelled")
	}
}

func TestFuncProbe(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	require.NoError(t, Spec{Type: TypeFunc, Check: okCheck}.Probe(ctx, ""))
	require.Equal(t, boom, Spec{Type: TypeFunc, Check: func(context.Context) error { return boom }}.Probe(ctx, ""))

	err := Spec{Type: TypeFunc, Check: func(context.Context) error { panic("kaboom") }}.Probe(ctx, "")
	require.EqualError(t, err, "health: check panicked: kaboom")
}

func TestFuncProbeGivesCheckItsDeadline(t *testing.T) {
	left := make(chan time.Duration, 1)
	spec := Spec{Type: TypeFunc, Timeout: 50 * time.Millisecond, Check: func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(time.Hour)
		}
		left <- time.Until(deadline)
		<-ctx.Done()
		return ctx.Err()
	}}
	require.ErrorIs(t, spec.Probe(context.Background(), ""), context.DeadlineExceeded)
	require.LessOrEqual(t, <-left, 50*time.Millisecond, "the check's context carries the probe timeout")
}

func TestFuncProbeDoesNotWaitForStuckCheck(t *testing.T) {
	release := make(chan struct{})
	returned := make(chan struct{})
	spec := Spec{Type: TypeFunc, Timeout: 50 * time.Millisecond, Check: func(context.Context) error {
		defer close(returned)
		<-release // ignores its context
		return nil
	}}
	err := spec.Probe(context.Background(), "")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualError(t, err, "health: check did not return within 50ms: context deadline exceeded")
	close(release)
	<-returned
}
