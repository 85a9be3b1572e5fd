package tunnel

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// errStoreDown is the sentinel of failingStore's errors.
var errStoreDown = errors.New("store down")

// failingStore is a Memory whose Updates fail, while fail is set, with an error that wraps
// errStoreDown, as a real store's errors wrap its sentinels.
type failingStore struct {
	*store.Memory
	fail atomic.Bool
}

func (s *failingStore) Update(ctx context.Context, key string, fn func(*store.Route) (*store.Route, error)) (*store.Route, error) {
	if s.fail.Load() {
		return nil, fmt.Errorf("fake store: update %q: %w", key, errStoreDown)
	}
	return s.Memory.Update(ctx, key, fn)
}

// A registration the store cannot record is refused as unavailable, and the refusal still
// says why: errors.Is reaches the store's own error through it, at the claim and at joined.
func TestRegistrationRefusedWithTheStoresError(t *testing.T) {
	st := &failingStore{Memory: store.NewMemory()}
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	b, err := newRouteBook(st, time.Hour, reg, nil, zaptest.NewLogger(t))
	require.NoError(t, err)
	req := &group.JoinRequest{ID: "t1", Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: group.HashKey("k")}

	st.fail.Store(true)
	_, err = b.claim("acme", req, true, TenantLimits{})
	require.ErrorIs(t, err, ErrUnavailable, "claim")
	require.ErrorIs(t, err, errStoreDown, "claim")

	st.fail.Store(false)
	tk, err := b.claim("acme", req, true, TenantLimits{})
	require.NoError(t, err)
	m, err := reg.Join(*req)
	require.NoError(t, err)
	st.fail.Store(true)
	err = b.joined(tk, m.Group())
	require.ErrorIs(t, err, ErrUnavailable, "joined")
	require.ErrorIs(t, err, errStoreDown, "joined")
	require.Equal(t, codeFor(err), codeFor(ErrUnavailable), "the connector is told: unavailable")

	// In a cluster a solo TCP tunnel's port is reserved in the store first.
	st.fail.Store(false)
	reg = group.NewRegistry(group.Config{Ports: group.PortRange{Lo: 45200, Hi: 45209}})
	b, err = newRouteBook(st, time.Hour, reg, nil, zaptest.NewLogger(t))
	require.NoError(t, err)
	b.rules = &sharedRules{b: b, lease: time.Minute, edgeID: "edge-1"}
	st.fail.Store(true)
	_, err = b.claim("acme", &group.JoinRequest{ID: "t2", Proto: group.ProtoTCP}, false, TenantLimits{})
	require.ErrorIs(t, err, ErrUnavailable, "a cluster's port reservation")
	require.ErrorIs(t, err, errStoreDown, "a cluster's port reservation")
}
