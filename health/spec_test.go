package health

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func okCheck(context.Context) error { return nil }

func TestWithDefaultsFillsZeroFields(t *testing.T) {
	got := Spec{Type: TypeTCP}.WithDefaults()
	require.Equal(t, DefaultInterval, got.Interval)
	require.Equal(t, DefaultTimeout, got.Timeout)
	require.Equal(t, DefaultMaxFailed, got.MaxFailed)
	require.False(t, got.AnyStatus, "the default expects a 2xx status")

	// The documented defaults: every 10 s, 3 s timeout, 3 failures, 2xx expected.
	require.Equal(t, 10*time.Second, DefaultInterval)
	require.Equal(t, 3*time.Second, DefaultTimeout)
	require.Equal(t, 3, DefaultMaxFailed)
}

func TestWithDefaultsKeepsSetFields(t *testing.T) {
	in := Spec{Type: TypeHTTP, Path: "/h", Interval: 7 * time.Millisecond, Timeout: 5 * time.Millisecond, MaxFailed: 9, AnyStatus: true}
	require.Equal(t, in, in.WithDefaults())

	neg := Spec{Type: TypeTCP, Interval: -1, Timeout: -2, MaxFailed: -3}.WithDefaults()
	require.Equal(t, time.Duration(-1), neg.Interval, "negative values are left for Validate to reject")
	require.Equal(t, time.Duration(-2), neg.Timeout)
	require.Equal(t, -3, neg.MaxFailed)
}

func TestTCPReadiness(t *testing.T) {
	s := TCPReadiness()
	require.Equal(t, TypeTCP, s.Type)
	require.Equal(t, 3*time.Second, s.Interval)
	require.Equal(t, 400*time.Millisecond, s.Timeout)
	require.Equal(t, 2, s.MaxFailed)
	require.NoError(t, s.Validate())
	require.Equal(t, s, s.WithDefaults())
}

func TestValidateAcceptsUsableSpecs(t *testing.T) {
	for name, s := range map[string]Spec{
		"tcp with defaults":  {Type: TypeTCP},
		"http":               {Type: TypeHTTP, Path: "/healthz"},
		"http with query":    {Type: TypeHTTP, Path: "/health?full=1", AnyStatus: true},
		"func":               {Type: TypeFunc, Check: okCheck},
		"all fields set":     {Type: TypeTCP, Interval: time.Millisecond, Timeout: time.Millisecond, MaxFailed: 1},
		"timeout > interval": {Type: TypeTCP, Interval: time.Millisecond, Timeout: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, s.Validate())
		})
	}
}

func TestValidateRejectsBadSpecs(t *testing.T) {
	for name, tc := range map[string]struct {
		spec Spec
		want string
	}{
		"missing type":        {Spec{}, "Type is required"},
		"unknown type":        {Spec{Type: "udp"}, `unknown Type "udp"`},
		"type is exact":       {Spec{Type: "TCP"}, `unknown Type "TCP"`},
		"http without path":   {Spec{Type: TypeHTTP}, `Path is required for Type "http"`},
		"relative path":       {Spec{Type: TypeHTTP, Path: "healthz"}, `Path "healthz" must start with "/"`},
		"path with space":     {Spec{Type: TypeHTTP, Path: "/a b"}, "Path \"/a b\" contains a space or control character"},
		"path with CRLF":      {Spec{Type: TypeHTTP, Path: "/a\r\nX-Evil: 1"}, "contains a space or control character"},
		"path on tcp":         {Spec{Type: TypeTCP, Path: "/h"}, `Path is only used with Type "http"`},
		"func without check":  {Spec{Type: TypeFunc}, `Check is required for Type "func"`},
		"check on http":       {Spec{Type: TypeHTTP, Path: "/", Check: okCheck}, `Check is only used with Type "func"`},
		"negative interval":   {Spec{Type: TypeTCP, Interval: -time.Second}, "Interval must be positive, got -1s"},
		"negative timeout":    {Spec{Type: TypeTCP, Timeout: -time.Millisecond}, "Timeout must be positive, got -1ms"},
		"negative max_failed": {Spec{Type: TypeTCP, MaxFailed: -1}, "MaxFailed must be positive, got -1"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.spec.Validate()
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestProbeRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	require.ErrorIs(t, Spec{}.Probe(ctx, "127.0.0.1:1"), ErrInvalidSpec)

	for _, target := range []string{"", "127.0.0.1", "127.0.0.1:", "[::1"} {
		err := Spec{Type: TypeTCP}.Probe(ctx, target)
		require.ErrorIs(t, err, ErrInvalidTarget, "target %q", target)
		require.ErrorContains(t, err, target)
	}
	// The target is not used by a func check.
	require.NoError(t, Spec{Type: TypeFunc, Check: okCheck}.Probe(ctx, ""))
}
