package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// loadTarget is where one client sends its requests.
type loadTarget struct {
	url  string // http://127.0.0.1:port/path
	host string // Host header; "" means the URL's host
}

// loadOptions configures an HTTP load.
type loadOptions struct {
	clients   int
	targets   []loadTarget // client i uses targets[i%len(targets)]
	expectLen int64        // the body length every answer must have
	tagIDs    bool         // send a unique reqIDHeader with each request
	// rate, when positive, paces the clients: together they start rate requests per second,
	// evenly spread, instead of each sending its next request as soon as the last one ended.
	// A request held back because the one before it answered late counts its latency from
	// the time it was due, so a stall shows in the latency of the requests behind it too (no
	// coordinated omission).
	rate float64
	// caller, when set, replaces the HTTP/1.1 clients (targets, expectLen and tagIDs are then
	// unused): caller(i) returns client i's way to make one request, which returns the
	// answer's status (0 when none came) and an error for anything but a good answer. The
	// clients may share connections (HTTP/2, gRPC), which whoever runs the load opens before
	// and closes after it.
	caller func(i int) func(ctx context.Context) (int, error)
}

// failure is one failed request: a transport error, a status other than 200, or a short
// body.
type failure struct {
	id         uint64
	start, end time.Time
	status     int    // 0 for a transport error
	err        string // the error, or the start of the body for a bad status
}

// load is an HTTP load in progress: clients goroutines, each with its own keep-alive
// connection (its own http.Transport), sending GETs back to back until stop; or, with a
// caller, each making its calls on connections the clients share.
type load struct {
	opts      loadOptions
	recording atomic.Bool
	stopping  atomic.Bool
	wg        sync.WaitGroup
	clients   []*loadClient
	recStart  time.Time
	stopOnce  sync.Once
	result    loadResult
}

// requestIDs numbers requests uniquely across all loads of a process, so that a backend
// that lives through several loads never confuses two of them.
var requestIDs atomic.Uint64

// loadClient is one client's tally. Only its goroutine writes it until stop.
type loadClient struct {
	lat          []int64 // latencies (ns) of the successful recorded requests
	ok, failed   int
	warmupFailed int
	failures     []failure
	dials        atomic.Int64 // connections the client opened
}

// maxFailuresKept bounds the failures a client remembers in detail.
const maxFailuresKept = 10000

// startLoad starts the clients; nothing is recorded until record.
func startLoad(ctx context.Context, o loadOptions) *load {
	l := &load{opts: o}
	for i := range o.clients {
		c := &loadClient{lat: make([]int64, 0, 1<<14)}
		l.clients = append(l.clients, c)
		var t loadTarget
		if len(o.targets) > 0 {
			t = o.targets[i%len(o.targets)]
		}
		l.wg.Go(func() { l.client(ctx, c, t, i) })
	}
	return l
}

// record starts recording: requests that start from now on are counted.
func (l *load) record() {
	l.recStart = time.Now()
	l.recording.Store(true)
}

// loadResult is what a load measured while recording.
type loadResult struct {
	elapsed      time.Duration
	ok, failed   int
	warmupFailed int
	lat          []int64 // sorted latencies (ns) of the successful requests
	failures     []failure
	dials        int // connections the HTTP/1.1 clients opened (each keeps one alive); 0 with a caller
}

func (r loadResult) requests() int { return r.ok + r.failed }

// rps is successful requests per second.
func (r loadResult) rps() float64 { return float64(r.ok) / r.elapsed.Seconds() }

func (r loadResult) pct(q float64) time.Duration { return percentile(r.lat, q) }

// stop ends the load: every client finishes its request in flight and stops. It returns
// what was recorded; later calls return the same.
func (l *load) stop() loadResult {
	l.stopOnce.Do(func() { l.result = l.finish() })
	return l.result
}

func (l *load) finish() loadResult {
	end := time.Now()
	l.stopping.Store(true)
	l.wg.Wait()
	r := loadResult{elapsed: end.Sub(l.recStart)}
	n := 0
	for _, c := range l.clients {
		n += len(c.lat)
	}
	r.lat = make([]int64, 0, n)
	for _, c := range l.clients {
		r.lat = append(r.lat, c.lat...)
		r.ok += c.ok
		r.failed += c.failed
		r.warmupFailed += c.warmupFailed
		r.failures = append(r.failures, c.failures...)
		r.dials += int(c.dials.Load())
	}
	slices.Sort(r.lat)
	slices.SortFunc(r.failures, func(a, b failure) int { return a.start.Compare(b.start) })
	return r
}

func (l *load) client(ctx context.Context, c *loadClient, t loadTarget, index int) {
	if l.opts.caller != nil {
		call := l.opts.caller(index)
		l.loop(ctx, c, index, func(uint64) (int, error) { return call(ctx) })
		return
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c.dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConns:          1,
		MaxIdleConnsPerHost:   1,
		MaxConnsPerHost:       1,
		IdleConnTimeout:       time.Minute,
		ResponseHeaderTimeout: 15 * time.Second,
		DisableCompression:    true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		c.failed++
		c.failures = append(c.failures, failure{start: time.Now(), end: time.Now(), err: err.Error()})
		return
	}
	if t.host != "" {
		req.Host = t.host
	}
	buf := make([]byte, 32<<10)
	l.loop(ctx, c, index, func(id uint64) (int, error) {
		if l.opts.tagIDs {
			req.Header.Set(reqIDHeader, strconv.FormatUint(id, 10))
		}
		return roundTrip(tr, req, buf, l.opts.expectLen)
	})
}

// loop makes client c's requests with do, back to back or paced, until the load stops, and
// tallies them.
func (l *load) loop(ctx context.Context, c *loadClient, index int, do func(id uint64) (int, error)) {
	var interval time.Duration
	var due time.Time
	if l.opts.rate > 0 {
		interval = time.Duration(float64(l.opts.clients) / l.opts.rate * float64(time.Second))
		due = time.Now().Add(interval * time.Duration(index) / time.Duration(l.opts.clients))
	}
	for !l.stopping.Load() && ctx.Err() == nil {
		var start time.Time
		if interval > 0 {
			// Early: wait, and count from the moment the request goes out (the timer's
			// own lateness is not the system's). Late, because the last answer came after
			// this request was due: count from when it was due.
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
				if l.stopping.Load() {
					break // due after the load ended
				}
				start = time.Now()
			} else {
				start = due
			}
			due = due.Add(interval)
		}
		id := requestIDs.Add(1)
		if interval == 0 {
			start = time.Now()
		}
		// Recorded: requests due (paced) or sent (closed loop) once recording began; a paced
		// client catching up on requests due before then does not count them.
		rec := l.recording.Load() && !start.Before(l.recStart)
		status, err := do(id)
		end := time.Now()
		switch {
		case !rec:
			if err != nil {
				c.warmupFailed++
			}
		case err != nil:
			c.failed++
			if len(c.failures) < maxFailuresKept {
				c.failures = append(c.failures, failure{id: id, start: start, end: end, status: status, err: err.Error()})
			}
		default:
			c.ok++
			c.lat = append(c.lat, int64(end.Sub(start)))
		}
	}
}

// roundTrip sends req and reads the whole answer; anything but a 200 with a body of
// expectLen bytes is an error.
func roundTrip(tr http.RoundTripper, req *http.Request, buf []byte, expectLen int64) (int, error) {
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		n, _ := io.ReadFull(resp.Body, buf[:min(len(buf), 200)])
		return resp.StatusCode, fmt.Errorf("%s: %q", resp.Status, buf[:n])
	}
	n, err := io.CopyBuffer(io.Discard, readerOnly{resp.Body}, buf)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("reading the body: %w", err)
	}
	if n != expectLen {
		return resp.StatusCode, fmt.Errorf("body of %d bytes, want %d", n, expectLen)
	}
	return resp.StatusCode, nil
}

// runLoad runs a load for warmup unrecorded, then duration recorded. mark, when not nil, is
// called when recording starts and again once the load has stopped.
func runLoad(ctx context.Context, o loadOptions, warmup, duration time.Duration, mark func()) (loadResult, error) {
	l := startLoad(ctx, o)
	wait := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	wait(warmup)
	if mark != nil {
		mark()
	}
	l.record()
	wait(duration)
	r := l.stop()
	if mark != nil {
		mark()
	}
	return r, ctx.Err()
}
