package health

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// ReasonSucceeded is the Reason of every healthy [Report].
const ReasonSucceeded = "probe succeeded"

// DefaultJitter is the jitter fraction a [Prober] uses unless [WithJitter]
// says otherwise.
const DefaultJitter = 0.1

// maxFirstDelay caps the random delay before a Prober's first probe.
const maxFirstDelay = time.Second

// Report is one change of a target's health as seen by a [Prober].
type Report struct {
	// Healthy is the new state.
	Healthy bool
	// Reason explains the change. It is ReasonSucceeded for a healthy
	// report and, for an unhealthy one, the number of consecutive failures
	// and the last probe's error, for example
	// "3 consecutive probe failures: dial tcp 127.0.0.1:3000: connect: connection refused".
	Reason string
	// At is when the probe that caused the change finished.
	At time.Time
}

// Option configures a [Prober].
type Option func(*options)

type options struct {
	logger *zap.Logger
	jitter float64
	rand   func() float64 // uniform in [0, 1)
}

// WithLogger makes the Prober log through l: each failed probe at debug
// level and each reported change at info level. The default (and a nil l)
// is zap.NewNop().
func WithLogger(l *zap.Logger) Option {
	return func(o *options) {
		if l == nil {
			l = zap.NewNop()
		}
		o.logger = l
	}
}

// WithJitter sets the fraction f by which a Prober spreads its probes:
// successive probes start Interval × (1 ± f) apart, chosen at random, and
// the first probe starts after a random delay in [0, min(f×Interval, 1s)].
// f must be in [0, 1); 0 disables jitter (the first probe then runs at
// once). The default is DefaultJitter.
func WithJitter(f float64) Option {
	return func(o *options) { o.jitter = f }
}

// withRand replaces the random source (uniform in [0, 1)); for tests.
func withRand(r func() float64) Option {
	return func(o *options) { o.rand = r }
}

// Prober probes one target periodically and reports changes of its health.
//
// Its state starts unknown. It reports healthy on the first successful
// probe and unhealthy once Spec.MaxFailed consecutive probes have failed;
// after that it reports healthy again on the next success, and unhealthy
// again after another MaxFailed consecutive failures. A success resets the
// failure count. Nothing is reported while the state stays the same.
//
// A TypeFunc Check that ignores its context cannot hold Run: the probe fails
// when Timeout expires and Run goes on. The Prober never starts a second
// call while that one is still running; until it returns, every probe fails
// with [ErrCheckStillRunning]. When Run's context is done, Run waits at most
// Timeout for such a call before returning; a Check that never returns is
// left running in its goroutine (which then leaks) and its result is
// ignored.
type Prober struct {
	spec   Spec
	target string
	report func(Report)
	opts   options

	running atomic.Bool
	// checkDone is closed when a Check call that outlived its probe
	// returns; nil when no such call is outstanding. Only Run uses it, and
	// runs never overlap.
	checkDone <-chan struct{}
}

// NewProber returns a Prober that probes target (a "host:port" address,
// ignored for TypeFunc) as spec says, after [Spec.WithDefaults], and passes
// each change of health to report. It validates its arguments and starts
// nothing; call [Prober.Run] to start probing.
func NewProber(spec Spec, target string, report func(Report), opts ...Option) (*Prober, error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := spec.validateTarget(target); err != nil {
		return nil, err
	}
	if report == nil {
		return nil, errors.New("health: NewProber needs a non-nil report function")
	}
	o := options{logger: zap.NewNop(), jitter: DefaultJitter, rand: rand.Float64}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if math.IsNaN(o.jitter) || o.jitter < 0 || o.jitter >= 1 {
		return nil, fmt.Errorf("%w: jitter must be in [0, 1), got %v", ErrInvalidOption, o.jitter)
	}
	return &Prober{spec: spec, target: target, report: report, opts: o}, nil
}

// Run probes the target until ctx is done and then returns nil. It calls
// the report function serially, from the goroutine that called Run, and
// does not probe while a report call is in progress. Each Run starts from
// the unknown state, so a new Run reports its first edge even when an
// earlier Run already reported the same state.
// A probe never outlives Run (but see [Prober] about a Check that ignores
// its context). Run returns [ErrRunning] if another Run of p is in
// progress.
func (p *Prober) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("health: Run called with a nil context")
	}
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer p.running.Store(false)
	defer p.awaitCheck()

	log := p.opts.logger.With(zap.String("type", string(p.spec.Type)), zap.String("target", p.target))
	var st state
	timer := time.NewTimer(p.firstDelay())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		start := time.Now()
		err := p.probeOnce(ctx)
		if ctx.Err() != nil {
			return nil // the probe was cut short; its outcome means nothing
		}
		now := time.Now()
		if err != nil {
			log.Debug("health probe failed", zap.Error(err))
		}
		if r, changed := st.observe(err, p.spec.MaxFailed, now); changed {
			log.Info("health changed", zap.Bool("healthy", r.Healthy), zap.String("reason", r.Reason))
			p.report(r)
		}
		timer.Reset(max(0, p.nextDelay()-time.Since(start)))
	}
}

func (p *Prober) probeOnce(ctx context.Context) error {
	if p.checkDone != nil {
		select {
		case <-p.checkDone:
			p.checkDone = nil
		default:
			return ErrCheckStillRunning
		}
	}
	running, err := p.spec.probe(ctx, p.target)
	p.checkDone = running
	return err
}

// awaitCheck gives an outstanding Check call up to Timeout to return.
func (p *Prober) awaitCheck() {
	if p.checkDone == nil {
		return
	}
	t := time.NewTimer(p.spec.Timeout)
	defer t.Stop()
	select {
	case <-p.checkDone:
		p.checkDone = nil
	case <-t.C:
	}
}

// firstDelay is uniform in [0, min(jitter×Interval, 1s)].
func (p *Prober) firstDelay() time.Duration {
	limit := min(time.Duration(p.opts.jitter*float64(p.spec.Interval)), maxFirstDelay)
	return time.Duration(p.opts.rand() * float64(limit))
}

// nextDelay is uniform in [Interval×(1-jitter), Interval×(1+jitter)).
func (p *Prober) nextDelay() time.Duration {
	f := 1 + p.opts.jitter*(2*p.opts.rand()-1)
	d := f * float64(p.spec.Interval)
	if d >= math.MaxInt64 { // an absurdly long Interval must not wrap negative
		return math.MaxInt64
	}
	return time.Duration(d)
}

// state is a Prober's view of its target.
type state struct {
	known   bool
	healthy bool
	failed  int // consecutive failures
}

// observe records one probe outcome and returns the report to make, if the
// outcome changes the state.
func (s *state) observe(err error, maxFailed int, now time.Time) (Report, bool) {
	if err == nil {
		s.failed = 0
		if s.known && s.healthy {
			return Report{}, false
		}
		s.known, s.healthy = true, true
		return Report{Healthy: true, Reason: ReasonSucceeded, At: now}, true
	}
	s.failed++
	if s.failed < maxFailed || (s.known && !s.healthy) {
		return Report{}, false
	}
	s.known, s.healthy = true, false
	noun := "failures"
	if s.failed == 1 {
		noun = "failure"
	}
	return Report{
		Healthy: false,
		Reason:  fmt.Sprintf("%d consecutive probe %s: %v", s.failed, noun, err),
		At:      now,
	}, true
}
