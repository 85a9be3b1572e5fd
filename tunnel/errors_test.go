package tunnel

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/wire"
)

// Every refusal an edge sends comes back on the connector as the sentinel it was on the edge.
func TestWireCodesRoundTripTheirSentinels(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range wireCodes {
		require.False(t, seen[c.code], "code %s listed twice", c.code)
		seen[c.code] = true
		edgeErr := fmt.Errorf("%w: for route x", c.sentinel)
		code := codeFor(edgeErr)
		require.Equal(t, c.code, code)
		back := &RejectedError{Code: code, Message: edgeErr.Error()}
		require.ErrorIs(t, back, c.sentinel, "code %s", code)
		require.ErrorIs(t, back, ErrRejected)
	}
	require.Equal(t, wire.CodeInternal, codeFor(errors.New("disk on fire")))
}

// An error that wraps two sentinels is sent with one code, the same every time: the more
// specific refusal.
func TestWireCodeOfTwoSentinelsIsDeterministic(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %w", ErrUnavailable, ErrLimit), wire.CodeLimit},
		{fmt.Errorf("%w: %w", ErrLimit, ErrUnavailable), wire.CodeLimit},
		{fmt.Errorf("%w: %w", ErrUnavailable, ErrOwned), wire.CodeOwned},
		{errors.Join(ErrProtocol, ErrKeyMismatch), wire.CodeKeyMismatch},
	}
	for _, c := range cases {
		for range 200 {
			require.Equal(t, c.want, codeFor(c.err), "%v", c.err)
		}
	}
}
