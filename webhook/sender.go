package webhook

import (
	"bytes"
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
	DefaultTimeout   = 5 * time.Second
	DefaultWorkers   = 4
	DefaultQueueSize = 1024
)

// maxResponseBody is how much of a response body is read (and discarded)
// before the body is closed.
const maxResponseBody = 4 << 10

var (
	// ErrQueueFull is reported with ResultDropped when Send finds the queue
	// full.
	ErrQueueFull = errors.New("webhook: queue full")
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
	// ResultDropped: the delivery was never attempted because the queue was
	// full (ErrQueueFull) or the Sender was closed (ErrClosed).
	ResultDropped Result = "dropped"
)

// SenderConfig configures a Sender. The zero value is usable.
type SenderConfig struct {
	// Timeout bounds each request, from dial to the end of reading the
	// response. Default DefaultTimeout (5 s).
	Timeout time.Duration
	// Workers is the number of delivery goroutines, and so the most requests
	// in flight at once whatever the load. Default DefaultWorkers (4).
	Workers int
	// QueueSize is the number of deliveries that may wait for a worker.
	// Send drops (ResultDropped) when the queue is full, never blocks.
	// Default DefaultQueueSize (1024).
	QueueSize int
	// AllowPrivate allows untrusted (tenant) destinations that resolve to
	// loopback, private, link-local or unspecified addresses. Leave false on
	// a multi-tenant edge.
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

// Sender POSTs alert payloads from a fixed pool of workers. It is safe for
// concurrent use. Create it with NewSender and release it with Close.
type Sender struct {
	timeout   time.Duration
	log       *zap.Logger
	onResult  func(Destination, Result, error)
	trusted   *http.Client
	untrusted *http.Client
	owned     []*http.Transport // transports whose idle connections Close releases

	mu     sync.RWMutex // guards closed against concurrent Send/Close
	closed bool
	queue  chan job
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

type job struct {
	dest Destination
	body []byte
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
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Sender{
		timeout:  cfg.Timeout,
		log:      cfg.Logger,
		onResult: cfg.OnResult,
		queue:    make(chan job, cfg.QueueSize),
		done:     make(chan struct{}),
	}

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
// blocks on the network or on a full queue. A destination that cannot be
// queued (queue full, or Sender closed) is reported as ResultDropped
// immediately. Outcomes are reported through SenderConfig.OnResult and the
// logger.
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
	// Enqueue under the read lock (so Close cannot close the Sender midway),
	// but report drops after releasing it: OnResult may do anything.
	var dropped []Destination
	s.mu.RLock()
	closed := s.closed
	for _, d := range dests {
		if closed {
			dropped = append(dropped, d)
			continue
		}
		select {
		case s.queue <- job{dest: d, body: body}:
		default:
			dropped = append(dropped, d)
		}
	}
	s.mu.RUnlock()
	reason := ErrQueueFull
	if closed {
		reason = ErrClosed
	}
	for _, d := range dropped {
		s.report(d, ResultDropped, reason, 0)
	}
}

// Close stops accepting deliveries, lets in-flight requests finish (each is
// bounded by Timeout), reports every still-queued delivery as ResultDropped
// with ErrClosed, and waits for the workers to exit. It is idempotent and
// always returns nil; later Sends report ResultDropped.
func (s *Sender) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		s.mu.Unlock()

		s.wg.Wait()
		for {
			select {
			case j := <-s.queue:
				s.report(j.dest, ResultDropped, ErrClosed, 0)
			default:
				for _, t := range s.owned {
					t.CloseIdleConnections()
				}
				return
			}
		}
	})
	return nil
}

func (s *Sender) worker() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case j := <-s.queue:
			select {
			case <-s.done:
				s.report(j.dest, ResultDropped, ErrClosed, 0)
				continue
			default:
			}
			s.deliver(j)
		}
	}
}

// deliver makes the single POST for j and reports its outcome.
func (s *Sender) deliver(j job) {
	start := time.Now()
	if err := ValidateURL(j.dest.URL); err != nil {
		s.report(j.dest, ResultFailure, err, 0)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.dest.URL, bytes.NewReader(j.body))
	if err != nil {
		s.report(j.dest, ResultFailure, fmt.Errorf("%w: cannot build request", ErrInvalidURL), 0)
		return
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
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.report(j.dest, ResultFailure,
			fmt.Errorf("%w: %d from %s", ErrStatus, resp.StatusCode, redact(j.dest.URL)), time.Since(start))
		return
	}
	s.report(j.dest, ResultSuccess, nil, time.Since(start))
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
