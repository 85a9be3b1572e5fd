package cluster

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/natsstore"
)

// The buckets in memory storage can vanish under a running cluster (NATS restarted; here
// deleted by hand while NATS stays up, so that no reconnect helps): the edges create them
// again, renew their leases and write their members again, and each sees the other's
// members, also one registered afterwards.
func TestClusterRecreatesMissingBuckets(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 900 * time.Millisecond
	a, b := twoEdgesWithAMemberEach(t, nodes, lease)
	both := map[string]int{"a": 1, "b": 1}

	js, ctx := jetStreamOn(t, nodes[0])
	for _, name := range []string{"warren_members", "warren_leases", "warren_alerts"} {
		require.NoError(t, js.DeleteKeyValue(ctx, name))
	}

	require.Eventually(t, func() bool {
		for _, name := range []string{"warren_members", "warren_leases", "warren_alerts"} {
			if _, err := js.KeyValue(ctx, name); err != nil {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "the buckets were not created again")
	members, err := js.KeyValue(ctx, "warren_members")
	require.NoError(t, err)
	st, err := members.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, jetstream.MemoryStorage, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage)
	// Both members are written again (the others learn them from the bucket, not from memory).
	require.Eventually(t, func() bool {
		keys, err := members.Keys(ctx)
		return err == nil && len(keys) == 2
	}, 10*time.Second, 50*time.Millisecond, "the members' records were not written again")
	for _, e := range []*clusterEdge{a, b} {
		require.Eventually(t, func() bool { return edgeLease(a, e.id) == "held" && edgeLease(b, e.id) == "held" },
			10*time.Second, 50*time.Millisecond, "edge %s's lease is not held again", e.id)
	}
	a.waitMembers(t, "pool", both)
	b.waitMembers(t, "pool", both)
	// The edges found records they knew missing from the members bucket: NATS may have lost
	// route writes too, so for a lease first claims of unknown routes are refused as
	// unavailable (a connector tries again) while the edges write back what they remember.
	sess := a.connect(tunnel.WithReconnect(false))
	fresh := hostPort(backend(t, "F").URL)
	require.Eventually(t, func() bool {
		_, err = sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "fresh", Group: "g", GroupKey: "k"}, fresh)
		if err != nil && !errors.Is(err, tunnel.ErrUnavailable) {
			t.Errorf("a new route refused for another reason: %v", err)
		}
		return err == nil
	}, 3*lease, 50*time.Millisecond, "a new route was refused for more than the lease: %v", err)
	b.waitMembers(t, "fresh", map[string]int{"a": 1})
}

// isBucketMissing recognises what this nats.go returns for each operation the cluster does
// on a bucket that is gone, and not other failures; a handle opened before the bucket
// was created again works on the new bucket (the cluster keeps its handles).
func TestIsBucketMissingOnEveryOperation(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	nc, err := nats.Connect(nodes[0].ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: "gone", History: 1, Storage: jetstream.MemoryStorage}
	kv, created, err := openKV(ctx, js, cfg)
	require.NoError(t, err)
	require.True(t, created)
	_, err = kv.Put(ctx, "k", []byte("v"))
	require.NoError(t, err)
	_, err = kv.Get(ctx, "nope")
	require.False(t, isBucketMissing(err), "a missing key is not a missing bucket: %v", err)
	require.False(t, isBucketMissing(context.DeadlineExceeded))
	require.False(t, isBucketMissing(nats.ErrConnectionClosed))

	require.NoError(t, js.DeleteKeyValue(ctx, "gone"))
	_, err = kv.Put(ctx, "k", []byte("v"))
	require.True(t, isBucketMissing(err), "put: %v", err)
	_, err = kv.Get(ctx, "k")
	require.True(t, isBucketMissing(err), "get: %v", err)
	err = kv.Delete(ctx, "k")
	require.True(t, isBucketMissing(err), "delete: %v", err)
	_, err = kv.Status(ctx)
	require.True(t, isBucketMissing(err), "status: %v", err)
	w, err := kv.WatchAll(ctx)
	if err == nil {
		_ = w.Stop()
	}
	require.True(t, isBucketMissing(err), "watch: %v", err)
	_, err = js.KeyValue(ctx, "gone")
	require.True(t, isBucketMissing(err), "open: %v", err)

	// Created again, racing another creator: both succeed, and the old handle works.
	_, _, err = openKV(ctx, js, cfg)
	require.NoError(t, err)
	_, created, err = openKV(ctx, js, cfg)
	require.NoError(t, err)
	require.False(t, created)
	_, err = kv.Put(ctx, "k", []byte("again"))
	require.NoError(t, err)
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "again", string(e.Value()))
	require.Equal(t, uint64(1), e.Revision(), "the bucket is a new one")
}

// A stream over a link's cap of streams awaiting their envelope is refused at once
// (AckRefused), without waiting for OpenTimeout; and once the peer closes its streams,
// the accepting edge holds none of them any more (none waits for yamux's close timeout).
func TestPeerStreamsOverCapRefusedAndReleased(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	conn, ans := peerDial(t, b, clusterToken)
	require.Equal(t, byte(peerOK), ans)
	sess, err := yamux.Server(conn, yamux.DefaultConfig())
	require.NoError(t, err)
	defer sess.Close()
	var silent []*yamux.Stream
	for range maxPeerPending {
		st, err := sess.OpenStream()
		require.NoError(t, err)
		silent = append(silent, st)
	}
	// The edge accepted them all: its side of the link holds them.
	link := func() *yamux.Session {
		b.c.peers.mu.Lock()
		defer b.c.peers.mu.Unlock()
		for l := range b.c.peers.links {
			return l.sess
		}
		return nil
	}
	require.Eventually(t, func() bool { s := link(); return s != nil && s.NumStreams() >= maxPeerPending },
		5*time.Second, 10*time.Millisecond)

	over, err := sess.OpenStream()
	require.NoError(t, err)
	openTimeout := b.c.edge.OpenTimeout()
	require.Positive(t, openTimeout)
	_ = over.SetReadDeadline(time.Now().Add(openTimeout / 2))
	var ack [1]byte
	start := time.Now()
	_, err = io.ReadFull(over, ack[:])
	require.NoError(t, err, "the stream over the cap was not refused at once")
	require.Equal(t, byte(wire.AckRefused), ack[0])
	require.Less(t, time.Since(start), openTimeout/2)
	_ = over.Close()

	for _, st := range silent {
		_ = st.Close()
	}
	require.Eventually(t, func() bool { return link().NumStreams() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the edge still holds streams the peer closed")
	// The link still serves: a new stream is taken (and, with no envelope before the
	// peer closes it, answered as malformed rather than refused over a cap).
	st, err := sess.OpenStream()
	require.NoError(t, err)
	require.NoError(t, st.Close()) // yamux's Close ends this side's writing only
	_, err = io.ReadFull(st, ack[:])
	require.NoError(t, err)
	require.Equal(t, byte(wire.AckMalformed), ack[0])
	_ = st.Close()
}

// The routes bucket (file storage) survives a restart of NATS, but not a wiped NATS store:
// then natsstore.Store creates it again, with its own configuration, so that routes can be
// written again without restarting the edges. What the bucket created again holds is NATS's
// affair: nats-server 2.15's file storage may bring back a deleted bucket's records when one of
// its name is created again at once (reproduced with JetStream alone, without Warren), which
// the edges then read as claims, as after a restore from a backup.
func TestRouteStoreRecreatesMissingBucket(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	nc, err := nats.Connect(nodes[0].ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := natsstore.Open(ctx, nc, natsstore.Config{Bucket: "r_routes", Timeout: 2 * time.Second})
	require.NoError(t, err)
	defer s.Close()
	set := func(r *store.Route) func(*store.Route) (*store.Route, error) {
		return func(*store.Route) (*store.Route, error) { return r, nil }
	}
	_, err = s.Update(t.Context(), "http/a", set(&store.Route{Kind: store.KindHTTP, Label: "a", Tenant: "t1"}))
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	// wipe deletes the bucket and waits until JetStream no longer finds it (a read right
	// after the delete may still be answered from the old stream).
	wipe := func() {
		t.Helper()
		require.NoError(t, js.DeleteKeyValue(ctx, "r_routes"))
		require.Eventually(t, func() bool {
			_, err := js.KeyValue(ctx, "r_routes")
			return errors.Is(err, jetstream.ErrBucketNotFound)
		}, 5*time.Second, 5*time.Millisecond)
	}
	wipe()

	r, err := s.Get(t.Context(), "http/a")
	require.NoError(t, err, "a read of the vanished bucket")
	require.Nil(t, r, "the routes were lost with the bucket")
	_, err = s.Update(t.Context(), "http/b", set(&store.Route{Kind: store.KindHTTP, Label: "b", Tenant: "t2"}))
	require.NoError(t, err)
	wipe()
	_, err = s.Update(t.Context(), "http/c", set(&store.Route{Kind: store.KindHTTP, Label: "c", Tenant: "t3"}))
	require.NoError(t, err, "a write to the vanished bucket")
	wipe()
	// A list right after the delete may still be answered from the old stream, or fail while
	// JetStream finishes deleting it; within moments the bucket is there again and answers.
	require.Eventually(t, func() bool {
		_, err = s.List(t.Context())
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "a list of the vanished bucket: %v", err)
	_, err = s.Update(t.Context(), "http/d", set(&store.Route{Kind: store.KindHTTP, Label: "d", Tenant: "t4"}))
	require.NoError(t, err)
	all, err := s.List(t.Context())
	require.NoError(t, err)
	labels := map[string]string{}
	for _, r := range all {
		labels[r.Label] = r.Tenant
		require.Contains(t, []string{"a", "b", "c", "d"}, r.Label, "only records this test wrote")
	}
	require.Equal(t, "t4", labels["d"], "the write after the wipe is there")
	kv, err := js.KeyValue(ctx, "r_routes")
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, jetstream.FileStorage, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage)
}

// During a failover a route is unavailable, not unknown: when the edge serving a pool dies,
// the other edge answers its host 503 (not 404) while the dead edge's records still list the
// pool's members, until the connector registers again.
func TestClusterFailoverAnswers503Not404(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: 3 * time.Second})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: 3 * time.Second})
	_, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	require.Equal(t, http.StatusOK, b.getCode("pool"))
	a.kill()
	b.waitMembers(t, "pool", map[string]int{})
	_, listed := b.c.ServedElsewhere(store.KindHTTP, "pool")
	require.True(t, listed, "a's records lapsed before the check")
	require.Equal(t, http.StatusServiceUnavailable, b.getCode("pool"))
	require.Equal(t, http.StatusNotFound, b.getCode("nothing-here"), "a host no edge serves is still unknown")
}
