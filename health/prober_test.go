package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// edge is a report without its timestamp.
type edge struct {
	Healthy bool
	Reason  string
}

var (
	up   = edge{true, ReasonSucceeded}
	down = func(n int, err string) edge {
		return edge{false, fmt.Sprintf("%d consecutive probe failures: %s", n, err)}
	}
)

// runScript runs a Prober whose TypeFunc check returns results in order and
// returns the reports it made. The call after the last result ends the run.
func runScript(t *testing.T, maxFailed int, results []error) []edge {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := 0 // the prober never runs two checks at once
	spec := Spec{
		Type:      TypeFunc,
		Interval:  time.Millisecond,
		Timeout:   5 * time.Second,
		MaxFailed: maxFailed,
		Check: func(context.Context) error {
			i := calls
			calls++
			if i == len(results) {
				cancel()
				return nil
			}
			return results[i]
		},
	}
	var reports []Report
	p, err := NewProber(spec, "", func(r Report) { reports = append(reports, r) }, WithJitter(0))
	require.NoError(t, err)
	require.NoError(t, p.Run(ctx))
	require.Equal(t, len(results)+1, calls, "the script ran to its end")

	edges := []edge{}
	var last time.Time
	for _, r := range reports {
		require.False(t, r.At.Before(last), "report times never go backwards")
		last = r.At
		edges = append(edges, edge{r.Healthy, r.Reason})
	}
	return edges
}

func TestProberReportsOnlyEdges(t *testing.T) {
	e1, e2, e3, e4 := errors.New("e1"), errors.New("e2"), errors.New("e3"), errors.New("e4")
	for _, tc := range []struct {
		name      string
		maxFailed int
		script    []error
		want      []edge
	}{
		{"first success", 3, []error{nil}, []edge{up}},
		{"steady healthy", 3, []error{nil, nil, nil, nil}, []edge{up}},
		{"failures below max report nothing", 3, []error{e1, e2}, []edge{}},
		{"max failures from unknown", 3, []error{e1, e2, e3}, []edge{down(3, "e3")}},
		{"steady unhealthy reports once", 3, []error{e1, e2, e3, e4, e1, e2, e3}, []edge{down(3, "e3")}},
		{"healthy then max failures", 3, []error{nil, e1, e2, e3}, []edge{up, down(3, "e3")}},
		{"recovery on next success", 3, []error{e1, e2, e3, nil, nil}, []edge{down(3, "e3"), up}},
		{"success resets the count", 3, []error{nil, e1, e2, nil, e3, e4, nil, e1, e2}, []edge{up}},
		{"reset also before first report", 3, []error{e1, e2, nil, e3, e4}, []edge{up}},
		{"flapping", 2, []error{nil, e1, e2, nil, e3, e4, e1, nil, nil, e2, e3},
			[]edge{up, down(2, "e2"), up, down(2, "e4"), up, down(2, "e3")}},
		{"max one", 1, []error{e1, nil, e2, e3, nil},
			[]edge{{false, "1 consecutive probe failure: e1"}, up, {false, "1 consecutive probe failure: e2"}, up}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, runScript(t, tc.maxFailed, tc.script))
		})
	}
}

func TestProberUsesDefaultMaxFailed(t *testing.T) {
	boom := errors.New("boom")
	require.Equal(t, []edge{down(DefaultMaxFailed, "boom")}, runScript(t, 0, []error{boom, boom, boom}))
}

func TestProberReportsAreSerial(t *testing.T) {
	script := make([]error, 200)
	for i := range script {
		if i%2 == 1 {
			script[i] = errors.New("down")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var calls, inReport, overlaps, reports atomic.Int32
	spec := Spec{Type: TypeFunc, Interval: time.Microsecond, MaxFailed: 1, Check: func(context.Context) error {
		i := int(calls.Add(1)) - 1
		if inReport.Load() != 0 {
			overlaps.Add(1) // a probe while a report is in progress
		}
		if i == len(script) {
			cancel()
			return nil
		}
		return script[i]
	}}
	p, err := NewProber(spec, "", func(Report) {
		if inReport.Add(1) != 1 {
			overlaps.Add(1)
		}
		reports.Add(1)
		for range 100 {
			runtime.Gosched() // give any concurrent caller a chance to show up
		}
		inReport.Add(-1)
	}, WithJitter(0))
	require.NoError(t, err)
	require.NoError(t, p.Run(ctx))
	require.EqualValues(t, len(script), reports.Load(), "every probe flipped the state")
	require.Zero(t, overlaps.Load())
}

func TestProberDoesNotProbeWhileReportBlocks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	entered := make(chan struct{})
	release := make(chan struct{})
	spec := Spec{Type: TypeFunc, Interval: time.Millisecond, Check: func(context.Context) error {
		calls.Add(1)
		return nil
	}}
	p, err := NewProber(spec, "", func(Report) {
		close(entered)
		<-release
	}, WithJitter(0))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	<-entered
	require.EqualValues(t, 1, calls.Load())
	require.Never(t, func() bool { return calls.Load() > 1 }, 50*time.Millisecond, 5*time.Millisecond,
		"no probe runs while report is in progress")
	close(release)
	require.Eventually(t, func() bool { return calls.Load() > 1 }, 5*time.Second, time.Millisecond,
		"probing resumes after report returns")
	cancel()
	require.NoError(t, <-done)
}

// startRun runs p in a goroutine; the returned stop cancels it and waits for
// Run to return.
func startRun(t *testing.T, p *Prober) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

func awaitReport(t *testing.T, reports <-chan Report) Report {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no report")
		return Report{}
	}
}

func TestProberTCPTargetGoesAway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()

	spec := TCPReadiness()
	spec.Interval = 5 * time.Millisecond
	spec.Timeout = time.Second
	reports := make(chan Report, 10)
	p, err := NewProber(spec, addr, func(r Report) { reports <- r })
	require.NoError(t, err)
	stop := startRun(t, p)

	r := awaitReport(t, reports)
	require.True(t, r.Healthy)
	require.Equal(t, ReasonSucceeded, r.Reason)
	require.False(t, r.At.IsZero())

	require.NoError(t, ln.Close())
	r = awaitReport(t, reports)
	require.False(t, r.Healthy)
	require.Contains(t, r.Reason, "2 consecutive probe failures: dial tcp "+addr)
	stop()
	require.Empty(t, reports, "nothing but the two edges")
}

func TestProberStuckCheck(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	spec := Spec{
		Type:      TypeFunc,
		Interval:  time.Millisecond,
		Timeout:   20 * time.Millisecond,
		MaxFailed: 3,
		Check: func(context.Context) error {
			calls.Add(1)
			<-release // ignores its context
			return nil
		},
	}
	reports := make(chan Report, 10)
	p, err := NewProber(spec, "", func(r Report) { reports <- r }, WithJitter(0))
	require.NoError(t, err)
	stop := startRun(t, p)

	r := awaitReport(t, reports)
	require.False(t, r.Healthy)
	require.Equal(t, "3 consecutive probe failures: "+ErrCheckStillRunning.Error(), r.Reason)
	require.EqualValues(t, 1, calls.Load(), "a stuck check is not called again")

	close(release)
	r = awaitReport(t, reports)
	require.True(t, r.Healthy, "the prober calls the check again once it returned")
	require.GreaterOrEqual(t, calls.Load(), int32(2))
	stop()
}

func TestProberRunStopsPromptly(t *testing.T) {
	t.Run("between probes", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		reports := make(chan Report, 1)
		p, err := NewProber(Spec{Type: TypeTCP, Interval: time.Hour}, ln.Addr().String(),
			func(r Report) { reports <- r }, WithJitter(0))
		require.NoError(t, err)
		stop := startRun(t, p)
		require.True(t, awaitReport(t, reports).Healthy)
		stop() // fails the test unless Run returns well before the next probe
	})

	t.Run("already cancelled", func(t *testing.T) {
		p, err := NewProber(Spec{Type: TypeFunc, Check: okCheck}, "", func(Report) {
			t.Error("no report expected")
		}, WithJitter(0))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, p.Run(ctx))
	})

	t.Run("during an HTTP probe", func(t *testing.T) {
		accepted := make(chan struct{}, 1)
		addr := rawServer(t, func(c net.Conn) {
			readRequest(c) // the probe is now waiting for the status line
			accepted <- struct{}{}
			_, _ = io.Copy(io.Discard, c)
		})
		p, err := NewProber(Spec{Type: TypeHTTP, Path: "/", Timeout: time.Minute}, addr,
			func(Report) { t.Error("no report expected") }, WithJitter(0))
		require.NoError(t, err)
		stop := startRun(t, p)
		<-accepted
		stop()
	})

	t.Run("during a check that honours ctx", func(t *testing.T) {
		started := make(chan struct{}, 1)
		p, err := NewProber(Spec{Type: TypeFunc, Timeout: time.Minute, Check: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}}, "", func(Report) { t.Error("no report expected") }, WithJitter(0))
		require.NoError(t, err)
		stop := startRun(t, p)
		<-started
		stop()
	})

	t.Run("during a check that ignores ctx", func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		started := make(chan struct{}, 1)
		release := make(chan struct{})
		returned := make(chan struct{})
		p, err := NewProber(Spec{Type: TypeFunc, Timeout: timeout, Check: func(context.Context) error {
			defer close(returned)
			started <- struct{}{}
			<-release
			return nil
		}}, "", func(Report) { t.Error("no report expected") }, WithJitter(0))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-started
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(timeout + 2*time.Second):
			t.Fatal("Run hung on a check that ignores its context")
		}
		close(release)
		<-returned
	})
}

func TestProberRunOnceAtATimeAndRestartable(t *testing.T) {
	reports := make(chan Report, 10)
	p, err := NewProber(Spec{Type: TypeFunc, Interval: time.Hour, Check: okCheck}, "",
		func(r Report) { reports <- r }, WithJitter(0))
	require.NoError(t, err)

	stop := startRun(t, p)
	require.True(t, awaitReport(t, reports).Healthy)
	require.ErrorIs(t, p.Run(context.Background()), ErrRunning)
	stop()

	// A new Run starts from the unknown state and reports again.
	stop = startRun(t, p)
	require.True(t, awaitReport(t, reports).Healthy)
	stop()
}

func TestNewProberRejectsBadInput(t *testing.T) {
	noop := func(Report) {}
	_, err := NewProber(Spec{Type: TypeHTTP}, "127.0.0.1:80", noop)
	require.ErrorIs(t, err, ErrInvalidSpec)

	_, err = NewProber(Spec{Type: TypeTCP}, "localhost", noop)
	require.ErrorIs(t, err, ErrInvalidTarget)

	_, err = NewProber(Spec{Type: TypeTCP}, "127.0.0.1:80", nil)
	require.ErrorContains(t, err, "non-nil report")

	for _, j := range []float64{-0.1, 1, 2, math.NaN(), math.Inf(1)} {
		_, err = NewProber(Spec{Type: TypeTCP}, "127.0.0.1:80", noop, WithJitter(j))
		require.ErrorIs(t, err, ErrInvalidOption, "jitter %v", j)
		require.ErrorContains(t, err, "jitter must be in [0, 1)")
	}

	p, err := NewProber(Spec{Type: TypeTCP}, ":80", noop, WithLogger(nil), nil)
	require.NoError(t, err, "empty host means the local system; nil logger and option are ignored")
	require.Equal(t, DefaultJitter, p.opts.jitter)
	require.Equal(t, DefaultInterval, p.spec.Interval, "the prober applies the defaults")
}

func TestJitterDelays(t *testing.T) {
	newP := func(interval time.Duration, jitter float64, r float64) *Prober {
		p, err := NewProber(Spec{Type: TypeFunc, Interval: interval, Check: okCheck}, "", func(Report) {},
			WithJitter(jitter), withRand(func() float64 { return r }))
		require.NoError(t, err)
		return p
	}
	const almostOne = 1 - 1e-9

	// Interval × (1 ± jitter).
	require.Equal(t, 900*time.Millisecond, newP(time.Second, 0.1, 0).nextDelay())
	require.Equal(t, time.Second, newP(time.Second, 0.1, 0.5).nextDelay())
	require.InDelta(t, float64(1100*time.Millisecond), float64(newP(time.Second, 0.1, almostOne).nextDelay()), float64(time.Microsecond))
	require.Equal(t, 5*time.Second, newP(10*time.Second, 0.5, 0).nextDelay())

	require.Equal(t, time.Duration(math.MaxInt64), newP(math.MaxInt64, 0.5, almostOne).nextDelay(), "no overflow")

	// First delay in [0, min(jitter × Interval, 1s)].
	require.Zero(t, newP(time.Second, 0.1, 0).firstDelay())
	require.InDelta(t, float64(100*time.Millisecond), float64(newP(time.Second, 0.1, almostOne).firstDelay()), float64(time.Microsecond))
	require.InDelta(t, float64(time.Second), float64(newP(time.Hour, 0.1, almostOne).firstDelay()), float64(time.Microsecond), "capped at 1s")

	// No jitter: fixed spacing, first probe at once.
	for _, r := range []float64{0, 0.5, almostOne} {
		require.Equal(t, time.Second, newP(time.Second, 0, r).nextDelay())
		require.Zero(t, newP(time.Second, 0, r).firstDelay())
	}
}

func TestDefaultJitterIsRandomAndBounded(t *testing.T) {
	p, err := NewProber(Spec{Type: TypeFunc, Interval: 10 * time.Second, Check: okCheck}, "", func(Report) {})
	require.NoError(t, err)
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := p.nextDelay()
		require.GreaterOrEqual(t, d, 9*time.Second)
		require.LessOrEqual(t, d, 11*time.Second)
		f := p.firstDelay()
		require.GreaterOrEqual(t, f, time.Duration(0))
		require.LessOrEqual(t, f, time.Second)
		seen[d] = true
	}
	require.Greater(t, len(seen), 100, "delays are spread, not fixed")
}
