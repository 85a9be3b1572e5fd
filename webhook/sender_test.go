package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	// Many destinations: each has one delivery in flight at most, so the bound on the
	// whole Sender is the number of workers.
	for i := range sends {
		s.Send([]Destination{{URL: fmt.Sprintf("%s/d%d", srv.URL, i%16), Trusted: true}}, samplePayload())
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

// hangingServer never answers a request until release is closed (or the client gives up);
// it reports each arrival's path.
type hangingServer struct {
	*httptest.Server
	arrived  chan string
	release  chan struct{}
	inFlight atomic.Int32
	peak     atomic.Int32
	// releaseAll lets every request held (and every later one) answer 200.
	releaseAll func()
}

func newHangingServer(t *testing.T) *hangingServer {
	t.Helper()
	h := &hangingServer{arrived: make(chan string, 4096), release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drainBody(r)
		n := h.inFlight.Add(1)
		defer h.inFlight.Add(-1)
		for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
		}
		h.arrived <- r.URL.Path
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
	}))
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(h.release) }); h.Close() })
	h.releaseAll = func() { once.Do(func() { close(h.release) }) }
	return h
}

// waitArrival waits (bounded) for the next request to reach h.
func (h *hangingServer) waitArrival(t *testing.T) string {
	t.Helper()
	select {
	case p := <-h.arrived:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the hanging receiver")
		return ""
	}
}

// tally records every outcome: per destination URL (for waitFor and of), and in order on ch.
type tally struct {
	mu     sync.Mutex
	byURL  map[string][]outcome
	taken  map[string]int // outcomes of each URL already returned by waitFor
	counts map[string]map[Result]int
	errs   map[Result]map[error]int
	ch     chan outcome
}

func newTally() *tally {
	return &tally{byURL: map[string][]outcome{}, taken: map[string]int{}, counts: map[string]map[Result]int{},
		errs: map[Result]map[error]int{}, ch: make(chan outcome, 16384)}
}

func (t *tally) hook(d Destination, r Result, err error) {
	t.mu.Lock()
	o := outcome{d, r, err}
	t.byURL[d.URL] = append(t.byURL[d.URL], o)
	if t.counts[d.URL] == nil {
		t.counts[d.URL] = map[Result]int{}
	}
	t.counts[d.URL][r]++
	for _, e := range []error{ErrQueueFull, ErrTooManyDestinations, ErrClosed} {
		if errors.Is(err, e) {
			if t.errs[r] == nil {
				t.errs[r] = map[error]int{}
			}
			t.errs[r][e]++
		}
	}
	t.mu.Unlock()
	t.ch <- o
}

func (t *tally) of(url string) map[Result]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[Result]int{}
	for r, n := range t.counts[url] {
		out[r] = n
	}
	return out
}

// waitFor waits (bounded) for the next outcome for url and returns it.
func (t *tally) waitFor(tt *testing.T, url string) outcome {
	tt.Helper()
	var o outcome
	require.Eventually(tt, func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		if i := t.taken[url]; i < len(t.byURL[url]) {
			o = t.byURL[url][i]
			t.taken[url] = i + 1
			return true
		}
		return false
	}, 5*time.Second, time.Millisecond, "no outcome for %s", url)
	return o
}

// A tenant whose URL hangs and is flooded with alerts fills only its own queue: another
// tenant's alert and the operator's are delivered at once, and only the hanging URL's
// alerts are dropped (and counted as dropped).
func TestSenderHangingDestinationDelaysAndDropsOnlyItsOwnAlerts(t *testing.T) {
	hang := newHangingServer(t)
	good, got := recordingServer(t, 8)
	res := newTally()
	const flood = 2000
	s := NewSender(SenderConfig{Timeout: time.Minute, AllowPrivate: true, OnResult: res.hook})
	defer s.Close()
	defer hang.releaseAll() // before Close, which waits for the requests in flight

	hanging := hang.URL + "/tenant-a"
	for range flood {
		s.Send([]Destination{{URL: hanging}}, samplePayload())
	}
	hang.waitArrival(t) // the first is in flight and will not come back
	tenantB, operator := good.URL+"/tenant-b", good.URL+"/operator"
	start := time.Now()
	s.Send(Destinations(operator, []string{hanging, tenantB}), samplePayload())
	for _, u := range []string{operator, tenantB} {
		o := res.waitFor(t, u)
		require.Equal(t, ResultSuccess, o.result, u)
	}
	require.Less(t, time.Since(start), 5*time.Second, "not delayed by the hanging URL")
	require.Len(t, got, 2)

	// Of the hanging URL's flood+1 alerts: one is in flight, UntrustedQueueSize wait, the
	// rest were dropped as they came.
	sent := flood + 1
	wantDropped := sent - 1 - DefaultUntrustedQueueSize
	require.Equal(t, map[Result]int{ResultDropped: wantDropped}, res.of(hanging))
	require.Equal(t, map[Result]int{ResultSuccess: 1}, res.of(tenantB))
	require.Equal(t, map[Result]int{ResultSuccess: 1}, res.of(operator))
	require.Equal(t, map[error]int{ErrQueueFull: wantDropped}, res.errs[ResultDropped])
	require.Equal(t, int32(1), hang.peak.Load(), "one delivery in flight per destination")

	// Close drops the queued ones at once and waits for the one in flight (released here).
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	require.Eventually(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.closed }, 5*time.Second, time.Millisecond)
	hang.releaseAll()
	<-closed
	require.Equal(t, map[Result]int{ResultDropped: sent - 1, ResultSuccess: 1}, res.of(hanging))
}

// The operator's (trusted) alerts never wait behind tenant URLs, even when every worker
// tenants may use is held by a hanging URL.
func TestSenderTrustedDestinationNeverWaitsBehindUntrusted(t *testing.T) {
	hang := newHangingServer(t)
	good, _ := recordingServer(t, 1)
	res := newTally()
	s := NewSender(SenderConfig{Workers: 2, Timeout: time.Minute, AllowPrivate: true, OnResult: res.hook})
	defer s.Close()
	defer hang.releaseAll() // before Close, which waits for the requests in flight
	var tenants []string
	for i := range 5 {
		tenants = append(tenants, fmt.Sprintf("%s/tenant-%d", hang.URL, i))
	}
	s.Send(Destinations("", tenants), samplePayload())
	hang.waitArrival(t)
	operator := good.URL + "/operator"
	s.Send([]Destination{{URL: operator, Trusted: true}}, samplePayload())
	require.Equal(t, ResultSuccess, res.waitFor(t, operator).result)
	require.Equal(t, int32(1), hang.peak.Load(), "of 2 workers, tenants may hold 1")
}

// Once hanging URLs have failed, they hold at most half of the tenant workers and wait for
// the others: a healthy tenant URL is served at once.
func TestSenderFailingDestinationsHoldAtMostHalfTheWorkers(t *testing.T) {
	var answer atomic.Bool // false: 500 at once; true: hang
	hang := newHangingServer(t)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answer.Load() {
			hang.Config.Handler.ServeHTTP(w, r)
			return
		}
		drainBody(r)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer flaky.Close()
	good, _ := recordingServer(t, 1)
	res := newTally()
	const workers = 9 // 8 for tenants, 4 of them for failing ones
	s := NewSender(SenderConfig{Workers: workers, Timeout: time.Minute, AllowPrivate: true, OnResult: res.hook})
	defer s.Close()
	defer hang.releaseAll() // before Close, which waits for the requests in flight

	var bad []string
	for i := range 12 {
		bad = append(bad, fmt.Sprintf("%s/bad-%d", flaky.URL, i))
	}
	s.Send(Destinations("", bad), samplePayload())
	for range bad {
		o := <-res.ch
		require.Equal(t, ResultFailure, o.result)
	}
	// Every bad URL is now failing; from here on they hang.
	answer.Store(true)
	for range 3 {
		s.Send(Destinations("", bad), samplePayload())
	}
	failingSlots := (workers - 1) / 2
	for range failingSlots {
		hang.waitArrival(t)
	}
	tenant := good.URL + "/tenant"
	s.Send([]Destination{{URL: tenant}}, samplePayload())
	require.Equal(t, ResultSuccess, res.waitFor(t, tenant).result)
	require.Equal(t, int32(failingSlots), hang.peak.Load(), "failing destinations hold half of the tenant workers")
	require.Equal(t, int32(failingSlots), hang.inFlight.Load(), "still held while the healthy tenant was served")
}

// However many distinct destinations are flooded, the Sender keeps state for a bounded
// number of them; the rest are dropped, and trusted destinations are never refused for it.
func TestSenderBoundsTheDestinationsItTracks(t *testing.T) {
	hang := newHangingServer(t)
	good, _ := recordingServer(t, 8)
	res := newTally()
	const maxDests = 8
	s := NewSender(SenderConfig{Workers: 2, Timeout: time.Minute, AllowPrivate: true, MaxUntrustedDestinations: maxDests, OnResult: res.hook})
	defer s.Close()
	defer hang.releaseAll() // before Close, which waits for the requests in flight
	var urls []string
	for i := range 1000 {
		urls = append(urls, fmt.Sprintf("%s/t%d", hang.URL, i))
	}
	for _, u := range urls {
		s.Send([]Destination{{URL: u}}, samplePayload())
	}
	s.mu.Lock()
	tracked := len(s.dests)
	s.mu.Unlock()
	require.Equal(t, maxDests, tracked)
	dropped := 0
	for range len(urls) - maxDests {
		o := <-res.ch
		require.Equal(t, ResultDropped, o.result)
		require.ErrorIs(t, o.err, ErrTooManyDestinations)
		dropped++
	}
	require.Equal(t, len(urls)-maxDests, dropped)

	operator := good.URL + "/operator"
	s.Send([]Destination{{URL: operator, Trusted: true}}, samplePayload())
	require.Equal(t, ResultSuccess, res.waitFor(t, operator).result)

	// Once the destinations drain, new ones are accepted again.
	hang.releaseAll()
	for _, u := range urls[:maxDests] {
		require.Equal(t, ResultSuccess, res.waitFor(t, u).result)
	}
	fresh := good.URL + "/fresh"
	s.Send([]Destination{{URL: fresh}}, samplePayload())
	require.Equal(t, ResultSuccess, res.waitFor(t, fresh).result)
}

// Failing destinations are remembered up to the bound; the oldest is forgotten to make room.
func TestSenderForgetsTheOldestFailingDestination(t *testing.T) {
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drainBody(r)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer bad.Close()
	res := newTally()
	s := NewSender(SenderConfig{Workers: 2, AllowPrivate: true, MaxUntrustedDestinations: 3, OnResult: res.hook})
	defer s.Close()
	for i := range 10 {
		u := fmt.Sprintf("%s/b%d", bad.URL, i)
		s.Send([]Destination{{URL: u}}, samplePayload())
		require.Equal(t, ResultFailure, res.waitFor(t, u).result)
		s.mu.Lock()
		n := len(s.dests)
		s.mu.Unlock()
		require.LessOrEqual(t, n, 3)
	}
}

// Deliveries to one destination are made one at a time, in the order they were sent.
func TestSenderDeliversInOrderPerDestination(t *testing.T) {
	srv, got := recordingServer(t, 100)
	res := newTally()
	s := NewSender(SenderConfig{OnResult: res.hook})
	for i := range 100 {
		p := samplePayload()
		p.MemberCount = i
		s.Send([]Destination{{URL: srv.URL, Trusted: true}}, p)
	}
	for range 100 {
		require.Equal(t, ResultSuccess, res.waitFor(t, srv.URL).result)
	}
	require.NoError(t, s.Close())
	close(got)
	want := 0
	for r := range got {
		var p Payload
		require.NoError(t, json.Unmarshal(r.body, &p))
		require.Equal(t, want, p.MemberCount)
		want++
	}
	require.Equal(t, 100, want)
}
