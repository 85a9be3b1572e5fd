package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// percentile returns the q-quantile (0 < q ≤ 1) of sorted by nearest rank; 0 when empty.
func percentile(sorted []int64, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return time.Duration(sorted[i])
}

// durations sorts ds as nanoseconds, for percentile.
func durations(ds []time.Duration) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = int64(d)
	}
	slices.Sort(out)
	return out
}

// median returns the median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// series collects one figure over the runs.
type series []float64

func (s series) median() float64 { return median(s) }

// list formats every run's value with f, for the per-run details.
func (s series) list(f func(float64) string) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = f(x)
	}
	return strings.Join(parts, ", ")
}

// Formatting helpers. Durations are shown in µs below a millisecond.
func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "−" + fmtDur(-d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
}

func fmtDurF(x float64) string { return fmtDur(time.Duration(x)) }

// fmtAdded formats a difference to direct: "+0.35 ms".
func fmtAdded(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

func fmtRate(x float64) string { return fmt.Sprintf("%.0f req/s", x) }

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", x)
}

// fmtMBps formats bytes per second as MB/s and Gbit/s.
func fmtMBps(bps float64) string {
	return fmt.Sprintf("%.0f MB/s (%.2f Gbit/s)", bps/1e6, bps*8/1e9)
}

func fmtMBpsF(bps float64) string { return fmt.Sprintf("%.0f", bps/1e6) }

func fmtKiB(x float64) string { return fmt.Sprintf("%.1f KiB", x/1024) }

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
