package cluster

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// A leases watch that stalled (its consumer lived on a NATS node that went away) and was
// restarted is no evidence by its restart: the view is fresh again only once the new watch
// delivered this edge's own renewal, and another edge whose renewals the stalled watch missed
// is not taken for lapsed before the view was fresh for a whole lease. Before, the restart
// counted as a renewal seen, and the next check, a tenth of a lease later, took every other
// edge for lapsed: issue 28's nemesis killed one NATS node of three (buckets of 3 replicas)
// and every edge dropped the other edges' members for about two seconds, their hosts
// answering 404 (seed 1, nats-kill nats-2).
func TestRestartedLeasesWatchIsNoEvidence(t *testing.T) {
	const lease = time.Second
	c := &Cluster{cfg: Config{LeaseTTL: lease}, log: zap.NewNop(), watchers: map[jetstream.KeyWatcher]struct{}{}}
	c.leaseOK.Store(true)
	c.connected.Store(true)
	start := time.Now()
	c.selfSeen.Store(start.Add(-lease).UnixNano()) // renewals written, not seen for a lease
	require.False(t, c.viewFresh(), "stale: the watches are restarted")
	require.False(t, c.viewFresh(), "restarted, but nothing delivered yet")
	c.selfSeen.Store(time.Now().UnixNano()) // the new watch delivers this edge's renewal
	require.True(t, c.viewFresh())

	other := &remoteEdge{lastSeen: start.Add(-2 * lease)} // the stalled watch missed its renewals too
	fresh := time.Now()
	require.False(t, c.lapsed(other, fresh, fresh), "the view just turned fresh")
	require.False(t, c.lapsed(other, fresh.Add(lease/2), fresh))
	require.True(t, c.lapsed(other, fresh.Add(lease), fresh), "no renewal seen in a lease of a fresh view")
	other.lastSeen = fresh.Add(lease / 4) // the restarted watch delivered its renewal
	require.False(t, c.lapsed(other, fresh.Add(lease), fresh))
	require.True(t, c.lapsed(other, fresh.Add(lease/4+lease), fresh))
	other.expired = true
	require.False(t, c.lapsed(other, fresh.Add(10*lease), fresh), "lapsed once")
}
