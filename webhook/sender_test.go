package webhook

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// outcome is one OnResult call.
type outcome struct {
	dest   Destination
	result Result
	err    error
}

// recorder collects OnResult calls on a buffered channel.
type recorder struct{ ch chan outcome }

func newRecorder(n int) *recorder { return &recorder{ch: make(chan outcome, n)} }

func (r *recorder) hook(d Destination, res Result, err error) { r.ch <- outcome{d, res, err} }

// next waits (bounded) for the next outcome.
func (r *recorder) next(t *testing.T) outcome {
	t.Helper()
	select {
	case o := <-r.ch:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for a delivery outcome")
		return outcome{}
	}
}

// request is what a test receiver saw.
type request struct {
	method, path, contentType, userAgent string
	body                                 []byte
}

// recordingServer answers 204 and records every request on a channel.
func recordingServer(t *testing.T, n int) (*httptest.Server, chan request) {
	t.Helper()
	ch := make(chan request, n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("User-Agent"), b}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

func samplePayload() Payload {
	return Payload{
		Event: EventGroupZeroHealthy, RegionID: "eu", Protocol: "http", Label: "pool",
		GroupName: "web", KeyHashShort: "deadbeef", MemberCount: 2, At: "2026-05-06T13:24:55+00:00",
	}
}

const sampleBody = `{"event":"group_zero_healthy","region_id":"eu","protocol":"http","label":"pool",` +
	`"group_name":"web","key_hash_short":"deadbeef","member_count":2,"at":"2026-05-06T13:24:55+00:00"}`

func TestSenderOnePostPerDestination(t *testing.T) {
	srv, got := recordingServer(t, 8)
	rec := newRecorder(8)
	s := NewSender(SenderConfig{OnResult: rec.hook, AllowPrivate: true})
	defer s.Close()

	dests := Destinations(srv.URL+"/operator", []string{srv.URL + "/tenant-a", srv.URL + "/tenant-b", srv.URL + "/tenant-a"})
	require.Len(t, dests, 3)
	s.Send(dests, samplePayload())

	results := map[string]Result{}
	for range dests {
		o := rec.next(t)
		require.NoError(t, o.err)
		results[o.dest.URL] = o.result
	}
	require.Equal(t, map[string]Result{
		srv.URL + "/operator": ResultSuccess,
		srv.URL + "/tenant-a": ResultSuccess,
		srv.URL + "/tenant-b": ResultSuccess,
	}, results)

	require.NoError(t, s.Close())
	close(got) // Close waited for every delivery, so the receiver saw all of them
	paths := map[string]int{}
	for r := range got {
		require.Equal(t, http.MethodPost, r.method)
		require.Equal(t, "application/json", r.contentType)
		require.Contains(t, strings.ToLower(r.userAgent), "warren")
		require.Equal(t, sampleBody, string(r.body))
		paths[r.path]++
	}
	require.Equal(t, map[string]int{"/operator": 1, "/tenant-a": 1, "/tenant-b": 1}, paths)
}

func TestSenderNon2xxIsFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(strings.Repeat("x", 64<<10))) // more than the Sender reads
	}))
	defer srv.Close()
	rec := newRecorder(1)
	s := NewSender(SenderConfig{OnResult: rec.hook})
	defer s.Close()

	s.Send([]Destination{{URL: srv.URL, Trusted: true}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultFailure, o.result)
	require.ErrorIs(t, o.err, ErrStatus)
	require.Contains(t, o.err.Error(), "500")
}

func TestSenderTransportErrorIsFailure(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens on this loopback port any more
	rec := newRecorder(1)
	s := NewSender(SenderConfig{OnResult: rec.hook})
	defer s.Close()

	s.Send([]Destination{{URL: url, Trusted: true}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultFailure, o.result)
	require.Error(t, o.err)
}

func TestSenderInvalidURLIsFailure(t *testing.T) {
	rec := newRecorder(2)
	s := NewSender(SenderConfig{OnResult: rec.hook})
	defer s.Close()

	s.Send([]Destination{{URL: "ftp://example.com/x"}, {URL: "not a url", Trusted: true}}, samplePayload())
	for range 2 {
		o := rec.next(t)
		require.Equal(t, ResultFailure, o.result)
		require.ErrorIs(t, o.err, ErrInvalidURL)
	}
}

func TestSenderSlowReceiverTimesOutWithoutDelayingSend(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		drainBody(r)
		<-r.Context().Done() // never answers; released when the client gives up
	}))
	defer srv.Close()

	var sendReturned atomic.Bool
	var returnedBeforeOutcome atomic.Bool
	rec := newRecorder(1)
	s := NewSender(SenderConfig{
		Timeout: 100 * time.Millisecond,
		OnResult: func(d Destination, r Result, err error) {
			returnedBeforeOutcome.Store(sendReturned.Load())
			rec.hook(d, r, err)
		},
	})
	defer s.Close()

	s.Send([]Destination{{URL: srv.URL, Trusted: true}}, samplePayload())
	sendReturned.Store(true)

	o := rec.next(t)
	require.Equal(t, ResultFailure, o.result)
	require.ErrorIs(t, o.err, context.DeadlineExceeded)
	require.True(t, returnedBeforeOutcome.Load(), "Send must return before the delivery finishes")
}

func TestSenderQueueFullDropsWithoutBlocking(t *testing.T) {
	arrived := make(chan struct{}, 8)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drainBody(r)
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	rec := newRecorder(8)
	s := NewSender(SenderConfig{Workers: 1, QueueSize: 1, OnResult: rec.hook})
	defer s.Close()
	dest := []Destination{{URL: srv.URL, Trusted: true}}

	s.Send(dest, samplePayload()) // taken by the only worker
	<-arrived
	s.Send(dest, samplePayload()) // fills the queue
	s.Send(dest, samplePayload()) // must be dropped at once, not wait for the worker

	o := rec.next(t)
	require.Equal(t, ResultDropped, o.result)
	require.ErrorIs(t, o.err, ErrQueueFull)

	close(release)
	for range 2 {
		o := rec.next(t)
		require.Equal(t, ResultSuccess, o.result)
		require.NoError(t, o.err)
	}
}

func TestSenderBoundsConcurrentDeliveries(t *testing.T) {
	const workers, sends = 4, 1000
	var inFlight, peak, arrivals atomic.Int32
	full := make(chan struct{}) // closed once `workers` requests are in flight together
	var fullOnce sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drainBody(r)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if n == workers {
			fullOnce.Do(func() { close(full) })
		}
		// The first arrivals wait for each other, proving the pool really
		// reaches `workers` in flight; the bound proves it never exceeds it.
		if arrivals.Add(1) <= workers {
			select {
			case <-full:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	var success, other atomic.Int32
	done := make(chan struct{})
	s := NewSender(SenderConfig{
		Workers:   workers,
		QueueSize: sends,
		OnResult: func(_ Destination, r Result, _ error) {
			if r == ResultSuccess {
				if success.Add(1) == sends {
					close(done)
				}
				return
			}
			other.Add(1)
		},
	})
	defer s.Close()

	dest := []Destination{{URL: srv.URL, Trusted: true}}
	for range sends {
		s.Send(dest, samplePayload())
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("only %d of %d deliveries succeeded (%d other outcomes)", success.Load(), sends, other.Load())
	}
	require.Zero(t, other.Load())
	require.Equal(t, int32(workers), peak.Load())
}

func TestSenderRefusesPrivateTenantButDeliversTrusted(t *testing.T) {
	srv, got := recordingServer(t, 8)
	tenant := srv.URL + "/services/T0/B0/SECRET" // srv listens on 127.0.0.1

	core, logs := observer.New(zapcore.DebugLevel)
	rec := newRecorder(8)
	s := NewSender(SenderConfig{OnResult: rec.hook, Logger: zap.New(core)})

	s.Send([]Destination{{URL: tenant}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultRefused, o.result)
	require.ErrorIs(t, o.err, ErrRefused)
	require.Contains(t, o.err.Error(), "127.0.0.1")
	require.NotContains(t, o.err.Error(), "SECRET", "errors carry scheme and host only")

	s.Send([]Destination{{URL: srv.URL + "/operator", Trusted: true}}, samplePayload())
	o = rec.next(t)
	require.Equal(t, ResultSuccess, o.result)
	require.NoError(t, s.Close())

	close(got)
	var paths []string
	for r := range got {
		paths = append(paths, r.path)
	}
	require.Equal(t, []string{"/operator"}, paths, "the refused tenant URL was never contacted")

	require.Equal(t, 2, logs.Len(), "every outcome is logged")
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			require.NotContains(t, k+"="+toString(v), "SECRET", "logs carry scheme and host only")
		}
		require.Equal(t, srv.URL, e.ContextMap()["destination"])
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

func TestSenderAllowPrivateDeliversTenant(t *testing.T) {
	srv, got := recordingServer(t, 1)
	rec := newRecorder(1)
	s := NewSender(SenderConfig{OnResult: rec.hook, AllowPrivate: true})
	defer s.Close()

	s.Send([]Destination{{URL: srv.URL + "/tenant"}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultSuccess, o.result)
	require.NoError(t, o.err)
	require.Equal(t, "/tenant", (<-got).path)
}

func TestSenderDoesNotFollowRedirectsForTenants(t *testing.T) {
	target, got := recordingServer(t, 2)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/landed", http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()

	rec := newRecorder(2)
	s := NewSender(SenderConfig{OnResult: rec.hook, AllowPrivate: true})

	s.Send([]Destination{{URL: redirector.URL + "/tenant"}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultFailure, o.result)
	require.ErrorIs(t, o.err, ErrStatus)
	require.Contains(t, o.err.Error(), "307")

	// A trusted destination's redirect is followed (and the body replayed).
	s.Send([]Destination{{URL: redirector.URL + "/operator", Trusted: true}}, samplePayload())
	o = rec.next(t)
	require.Equal(t, ResultSuccess, o.result)
	require.NoError(t, s.Close())

	close(got)
	var bodies []string
	for r := range got {
		require.Equal(t, "/landed", r.path)
		bodies = append(bodies, string(r.body))
	}
	require.Equal(t, []string{sampleBody}, bodies, "only the trusted redirect reached the target")
}

func TestSenderUsesConfiguredTransportForTrusted(t *testing.T) {
	var calls atomic.Int32
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return &http.Response{StatusCode: http.StatusAccepted, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	rec := newRecorder(1)
	s := NewSender(SenderConfig{OnResult: rec.hook, Transport: rt})
	defer s.Close()

	s.Send([]Destination{{URL: "https://ops.invalid/hook", Trusted: true}}, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultSuccess, o.result)
	require.Equal(t, int32(1), calls.Load())
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestSenderCloseWaitsAndDropsQueued(t *testing.T) {
	arrived := make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		drainBody(r)
		arrived <- struct{}{}
		<-r.Context().Done() // hold the worker until the request times out
	}))
	defer srv.Close()

	rec := newRecorder(8)
	s := NewSender(SenderConfig{Workers: 1, Timeout: time.Second, OnResult: rec.hook})
	dest := []Destination{{URL: srv.URL, Trusted: true}}

	s.Send(dest, samplePayload())
	<-arrived                     // the only worker is now busy
	s.Send(dest, samplePayload()) // queued
	s.Send(dest, samplePayload()) // queued

	require.NoError(t, s.Close())
	// Close returned only after the in-flight delivery finished (bounded by
	// Timeout) and the queued ones were reported, so all three are recorded.
	require.Len(t, rec.ch, 3)
	counts := map[Result]int{}
	for range 3 {
		o := <-rec.ch
		counts[o.result]++
		if o.result == ResultDropped {
			require.ErrorIs(t, o.err, ErrClosed)
		}
	}
	require.Equal(t, map[Result]int{ResultFailure: 1, ResultDropped: 2}, counts)

	require.NoError(t, s.Close(), "Close is idempotent")

	s.Send(dest, samplePayload())
	o := rec.next(t)
	require.Equal(t, ResultDropped, o.result)
	require.ErrorIs(t, o.err, ErrClosed)
}

func TestSenderConcurrentSendAndClose(t *testing.T) {
	srv, _ := recordingServer(t, 1000)
	var total atomic.Int32
	s := NewSender(SenderConfig{Workers: 2, QueueSize: 8, OnResult: func(Destination, Result, error) { total.Add(1) }})
	dest := []Destination{{URL: srv.URL, Trusted: true}}

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				s.Send(dest, samplePayload())
			}
		}()
	}
	wg.Add(2)
	for range 2 {
		go func() { defer wg.Done(); _ = s.Close() }()
	}
	wg.Wait()
	require.NoError(t, s.Close())
	require.Equal(t, int32(400), total.Load(), "every Send gets exactly one outcome, even racing Close")
}

func TestSenderSendNothing(t *testing.T) {
	var calls atomic.Int32
	s := NewSender(SenderConfig{OnResult: func(Destination, Result, error) { calls.Add(1) }})
	s.Send(nil, samplePayload())
	require.NoError(t, s.Close())
	require.Zero(t, calls.Load())
}

// drainBody reads the request body in full. net/http only notices that the
// client went away (cancelling r.Context()) once the body has been consumed.
func drainBody(r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }
