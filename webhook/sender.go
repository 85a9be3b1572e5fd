package webhook

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.uber.org/zap"
)

// UserAgent is the User-Agent header of every alert request.
const UserAgent = "warren-webhook/1"

// Defaults applied by NewSender to zero (or negative) SenderConfig fields.
const (
	DefaultTimeout                  = 5 * time.Second
	DefaultWorkers                  = 8
	DefaultQueueSize                = 1024
	DefaultUntrustedQueueSize       = 64
	DefaultMaxUntrustedDestinations = 1024
)

// maxResponseBody is how much of a response body is read (and discarded)
// before the body is closed.
const maxResponseBody = 4 << 10

var (
	// ErrQueueFull is reported with ResultDropped when Send finds the
	// destination's queue full. Only that destination's delivery is dropped.
	ErrQueueFull = errors.New("webhook: queue full")
	// ErrTooManyDestinations is reported with ResultDropped when Send meets
	// a new untrusted destination while MaxUntrustedDestinations others
	// already have deliveries queued or in flight.
	ErrTooManyDestinations = errors.New("webhook: too many destinations with pending deliveries")
	// ErrClosed is reported with ResultDropped for a delivery that was
	// queued when Close was called, or sent after Close.
	ErrClosed = errors.New("webhook: sender closed")
	// ErrStatus is reported (wrapped, with the status code) with
	// ResultFailure when a receiver answers with a non-2xx status.
	ErrStatus = errors.New("webhook: unexpected response status")
)

// Result is the outcome of one delivery attempt to one destination.
type Result string

// The possible Results.
const (
	// ResultSuccess: the receiver answered with a 2xx status.
	ResultSuccess Result = "success"
	// ResultFailure: a transport error, a timeout, an invalid URL or a
	// non-2xx status (including a redirect from an untrusted destination).
	ResultFailure Result = "failure"
	// ResultRefused: an untrusted destination resolved to a non-public
	// address (see ErrRefused).
	ResultRefused Result = "refused"
	// ResultDropped: the delivery was never attempted because its
	// destination's queue was full (ErrQueueFull), too many destinations
	// were pending (ErrTooManyDestinations) or the Sender was closed
	// (ErrClosed).
	ResultDropped Result = "dropped"
)

// SenderConfig configures a Sender. The zero value is usable.
type SenderConfig struct {
	// Timeout bounds each request, from dial to the end of reading the
	// response. Default DefaultTimeout (5 s).
	Timeout time.Duration
	// Workers is the number of delivery goroutines, and so the most requests
	// in flight at once whatever the load and however many destinations.
	// Default DefaultWorkers (8).
	Workers int
	// QueueSize is the number of deliveries that may wait for each trusted
	// destination. Default DefaultQueueSize (1024).
	QueueSize int
	// UntrustedQueueSize is the number of deliveries that may wait for each
	// untrusted destination. Default DefaultUntrustedQueueSize (64).
	UntrustedQueueSize int
	// MaxUntrustedDestinations bounds the untrusted destinations the Sender
	// keeps state for: those with deliveries queued or in flight, and those
	// remembered as failing. Default DefaultMaxUntrustedDestinations (1024).
	MaxUntrustedDestinations int
	// AllowPrivate allows untrusted (tenant) destinations that resolve to
	// addresses that are not globally reachable (see ErrRefused). Leave
	// false on a multi-tenant edge.
	AllowPrivate bool
	// Logger receives one entry per outcome. Default zap.NewNop().
	Logger *zap.Logger
	// OnResult, if set, is called once per destination of every Send with
	// its outcome and error (nil on success); use it for metrics. It is
	// called from Send (drops), from workers and from Close, possibly
	// concurrently, and must be fast. Errors never contain a URL's path or
	// query.
	OnResult func(d Destination, r Result, err error)
	// Transport, if set, is the base transport for trusted destinations
	// (useful in tests). The Sender does not close its idle connections.
	// Untrusted destinations always use the Sender's own guarded transport.
	Transport http.RoundTripper
}

// Sender POSTs alert payloads from a fixed pool of workers, with one queue per
// destination so that a slow or hanging receiver delays and drops only its
// own alerts. It is safe for concurrent use. Create it with NewSender and
// release it with Close.
//
// Scheduling rules:
//
//   - Each destination (URL, trusted or not) has its own bounded FIFO queue
//     and at most one delivery in flight: its deliveries are made one at a
//     time, in the order they were sent.
//   - Trusted destinations are served first, and untrusted ones never occupy
//     the last free worker (when Workers > 1), so the operator's alerts never
//     wait behind tenant URLs.
//   - An untrusted destination whose last delivery did not succeed is
//     failing: failing destinations are served after the others and occupy
//     at most half of the workers untrusted destinations may use (at least
//     one). A hanging tenant URL thus holds at most one worker, and hanging
//     URLs together hold at most half of them once they have failed.
//   - Memory is bounded: at most QueueSize deliveries wait per trusted
//     destination, UntrustedQueueSize per untrusted one, and
//     MaxUntrustedDestinations untrusted destinations are tracked.
type Sender struct {
	timeout   time.Duration
	log       *zap.Logger
	onResult  func(Destination, Result, error)
	trusted   *http.Client
	untrusted *http.Client
	owned     []*http.Transport // transports whose idle connections Close releases

	trustedCap, untrustedCap int // queue capacity per destination
	maxUntrusted             int // untrusted destinations tracked at most
	untrustedSlots           int // workers untrusted destinations may occupy
	failingSlots             int // workers failing destinations may occupy

	mu     sync.Mutex
	cond   *sync.Cond // signalled when work is queued, a worker frees up, or on Close
	closed bool
	dests  map[destKey]*destQueue
	// ready lists hold the destinations with queued work and none in flight.
	trustedReady, untrustedReady, failingReady fifo[*destQueue]
	idle                                       *list.List // failing untrusted destinations with nothing queued, oldest first
	untrustedCount                             int        // untrusted entries in dests
	untrustedBusy, failingBusy                 int        // workers delivering to them
	wg                                         sync.WaitGroup
	once                                       sync.Once
}

type job struct {
	dest Destination
	body []byte
}

// destKey identifies a destination's queue.
type destKey struct {
	url     string
	trusted bool
}

// destQueue is one destination's queue and state.
type destQueue struct {
	key     destKey
	jobs    fifo[job]
	busy    bool          // a delivery is in flight
	ready   bool          // in a ready list
	failing bool          // untrusted, and its last delivery did not succeed
	idle    *list.Element // in Sender.idle
}

// fifo is a queue backed by a slice.
type fifo[T any] struct {
	items []T
	head  int
}

func (f *fifo[T]) len() int { return len(f.items) - f.head }

func (f *fifo[T]) push(v T) { f.items = append(f.items, v) }

func (f *fifo[T]) pop() (T, bool) {
	var zero T
	if f.len() == 0 {
		return zero, false
	}
	v := f.items[f.head]
	f.items[f.head] = zero
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	} else if f.head > 32 && f.head*2 >= len(f.items) {
		f.items = append(f.items[:0], f.items[f.head:]...)
		f.head = 0
	}
	return v, true
}

// drain empties f and returns what it held.
func (f *fifo[T]) drain() []T {
	out := append([]T(nil), f.items[f.head:]...)
	f.items, f.head = nil, 0
	return out
}

// NewSender applies defaults to cfg and starts cfg.Workers delivery
// goroutines; Close stops them and waits for them.
func NewSender(cfg SenderConfig) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.UntrustedQueueSize <= 0 {
		cfg.UntrustedQueueSize = DefaultUntrustedQueueSize
	}
	if cfg.MaxUntrustedDestinations <= 0 {
		cfg.MaxUntrustedDestinations = DefaultMaxUntrustedDestinations
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Sender{
		timeout:        cfg.Timeout,
		log:            cfg.Logger,
		onResult:       cfg.OnResult,
		trustedCap:     cfg.QueueSize,
		untrustedCap:   cfg.UntrustedQueueSize,
		maxUntrusted:   cfg.MaxUntrustedDestinations,
		untrustedSlots: max(1, cfg.Workers-1),
		dests:          make(map[destKey]*destQueue),
		idle:           list.New(),
	}
	s.failingSlots = max(1, s.untrustedSlots/2)
	s.cond = sync.NewCond(&s.mu)

	trustedRT := cfg.Transport
	if trustedRT == nil {
		t := newTransport(cfg.Workers, &net.Dialer{Timeout: cfg.Timeout}, http.ProxyFromEnvironment)
		s.owned = append(s.owned, t)
		trustedRT = t
	}
	s.trusted = &http.Client{Transport: trustedRT}

	// Untrusted: no proxy (a proxy would dial the tenant's host for us and
	// bypass the address check), the check on the dialed IP, no redirects.
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		dialer.Control = checkDialAddr
	}
	ut := newTransport(cfg.Workers, dialer, nil)
	s.owned = append(s.owned, ut)
	s.untrusted = &http.Client{
		Transport: ut,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}

	s.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go s.worker()
	}
	return s
}

func newTransport(workers int, d *net.Dialer, proxy func(*http.Request) (*url.URL, error)) *http.Transport {
	return &http.Transport{
		Proxy:                 proxy,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   workers,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Send queues one POST of p to each destination and returns at once; it never
// blocks on the network or on a full queue. A destination whose delivery
// cannot be queued (its queue is full, too many untrusted destinations are
// pending, or the Sender is closed) is reported as ResultDropped immediately;
// the other destinations are not affected. Outcomes are reported through
// SenderConfig.OnResult and the logger.
func (s *Sender) Send(dests []Destination, p Payload) {
	if len(dests) == 0 {
		return
	}
	body, err := json.Marshal(p)
	if err != nil { // unreachable for Payload's field types; handled anyway
		for _, d := range dests {
			s.report(d, ResultFailure, fmt.Errorf("webhook: encode payload: %w", err), 0)
		}
		return
	}
	// Enqueue under the lock, but report drops after releasing it: OnResult
	// may do anything.
	type drop struct {
		d   Destination
		err error
	}
	var dropped []drop
	s.mu.Lock()
	for _, d := range dests {
		if err := s.enqueue(job{dest: d, body: body}); err != nil {
			dropped = append(dropped, drop{d, err})
		}
	}
	s.mu.Unlock()
	s.cond.Broadcast()
	for _, x := range dropped {
		s.report(x.d, ResultDropped, x.err, 0)
	}
}

// enqueue adds j to its destination's queue; s.mu is held.
func (s *Sender) enqueue(j job) error {
	if s.closed {
		return ErrClosed
	}
	k := destKey{url: j.dest.URL, trusted: j.dest.Trusted}
	q := s.dests[k]
	if q == nil {
		if !k.trusted && s.untrustedCount >= s.maxUntrusted {
			oldest := s.idle.Front()
			if oldest == nil {
				return ErrTooManyDestinations
			}
			s.forget(oldest.Value.(*destQueue))
		}
		q = &destQueue{key: k}
		s.dests[k] = q
		if !k.trusted {
			s.untrustedCount++
		}
	}
	limit := s.untrustedCap
	if k.trusted {
		limit = s.trustedCap
	}
	if q.jobs.len() >= limit {
		return ErrQueueFull
	}
	q.jobs.push(j)
	if q.idle != nil {
		s.idle.Remove(q.idle)
		q.idle = nil
	}
	if !q.busy && !q.ready {
		s.makeReady(q)
	}
	return nil
}

// makeReady puts q, which has queued work and none in flight, on its ready
// list; s.mu is held.
func (s *Sender) makeReady(q *destQueue) {
	q.ready = true
	switch {
	case q.key.trusted:
		s.trustedReady.push(q)
	case q.failing:
		s.failingReady.push(q)
	default:
		s.untrustedReady.push(q)
	}
}

// forget drops the state of q, which has nothing queued or in flight; s.mu is
// held.
func (s *Sender) forget(q *destQueue) {
	if q.idle != nil {
		s.idle.Remove(q.idle)
		q.idle = nil
	}
	delete(s.dests, q.key)
	if !q.key.trusted {
		s.untrustedCount--
	}
}

// next takes the destination a free worker serves next, following the
// scheduling rules of Sender, or returns nil; s.mu is held.
func (s *Sender) next() *destQueue {
	if q, ok := s.trustedReady.pop(); ok {
		return q
	}
	if s.untrustedBusy >= s.untrustedSlots {
		return nil
	}
	if q, ok := s.untrustedReady.pop(); ok {
		return q
	}
	if s.failingBusy < s.failingSlots {
		if q, ok := s.failingReady.pop(); ok {
			return q
		}
	}
	return nil
}

// Close stops accepting deliveries, lets in-flight requests finish (each is
// bounded by Timeout), reports every still-queued delivery as ResultDropped
// with ErrClosed, and waits for the workers to exit. It is idempotent and
// always returns nil; later Sends report ResultDropped.
func (s *Sender) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		var queued []job
		for _, q := range s.dests {
			queued = append(queued, q.jobs.drain()...)
		}
		s.mu.Unlock()
		s.cond.Broadcast()

		s.wg.Wait()
		for _, j := range queued {
			s.report(j.dest, ResultDropped, ErrClosed, 0)
		}
		for _, t := range s.owned {
			t.CloseIdleConnections()
		}
	})
	return nil
}

func (s *Sender) worker() {
	defer s.wg.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.closed {
			return
		}
		q := s.next()
		if q == nil {
			s.cond.Wait()
			continue
		}
		j, _ := q.jobs.pop()
		q.ready, q.busy = false, true
		failing := q.failing
		if !q.key.trusted {
			s.untrustedBusy++
			if failing {
				s.failingBusy++
			}
		}
		s.mu.Unlock()
		ok := s.deliver(j)
		s.mu.Lock()
		q.busy = false
		if !q.key.trusted {
			s.untrustedBusy--
			if failing {
				s.failingBusy--
			}
			q.failing = !ok
		}
		switch {
		case s.closed:
		case q.jobs.len() > 0:
			s.makeReady(q)
		case q.failing:
			q.idle = s.idle.PushBack(q) // remembered, so that its next delivery waits its turn
		default:
			s.forget(q)
		}
		s.cond.Broadcast() // a worker slot is free: another worker may now take a destination
	}
}

// deliver makes the single POST for j, reports its outcome and says whether
// it succeeded.
func (s *Sender) deliver(j job) bool {
	start := time.Now()
	if err := ValidateURL(j.dest.URL); err != nil {
		s.report(j.dest, ResultFailure, err, 0)
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.dest.URL, bytes.NewReader(j.body))
	if err != nil {
		s.report(j.dest, ResultFailure, fmt.Errorf("%w: cannot build request", ErrInvalidURL), 0)
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)

	client := s.untrusted
	if j.dest.Trusted {
		client = s.trusted
	}
	resp, err := client.Do(req)
	if err != nil {
		err = scrub(j.dest.URL, err)
		r := ResultFailure
		if errors.Is(err, ErrRefused) {
			r = ResultRefused
		}
		s.report(j.dest, r, err, time.Since(start))
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.report(j.dest, ResultFailure,
			fmt.Errorf("%w: %d from %s", ErrStatus, resp.StatusCode, redact(j.dest.URL)), time.Since(start))
		return false
	}
	s.report(j.dest, ResultSuccess, nil, time.Since(start))
	return true
}

// scrub replaces the *url.Error that net/http returns (whose message holds
// the full URL) with an error naming only scheme and host, keeping the cause
// reachable through errors.Is/As.
func scrub(rawURL string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("webhook: post to %s: %w", redact(rawURL), err)
}

// report logs one outcome and calls the OnResult hook.
func (s *Sender) report(d Destination, r Result, err error, took time.Duration) {
	fields := []zap.Field{
		zap.String("destination", redact(d.URL)),
		zap.Bool("trusted", d.Trusted),
		zap.String("result", string(r)),
	}
	if took > 0 {
		fields = append(fields, zap.Duration("took", took))
	}
	if err != nil {
		fields = append(fields, zap.Error(err))
		s.log.Warn("webhook alert not delivered", fields...)
	} else {
		s.log.Info("webhook alert delivered", fields...)
	}
	if s.onResult != nil {
		s.onResult(d, r, err)
	}
}
