package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// Member records and what other edges decide from them: a connector's resume proof
// (a solo tunnel moving edge) and a pool's keys mid-rotation.

// rawControl opens a hand-made connector connection to addr and its control stream.
func rawControl(t *testing.T, addr string) (*yamux.Session, net.Conn) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	sess, err := yamux.Client(c, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	st, err := sess.OpenStream()
	require.NoError(t, err)
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	return sess, st
}

// rawHello opens a hand-made connector session on addr, resuming session resume with token
// when resume is set, and returns its Welcome.
func rawHello(t *testing.T, addr, resume, token string) (*yamux.Session, net.Conn, *wire.Welcome) {
	t.Helper()
	mux, ctrl := rawControl(t, addr)
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version, ResumeSession: resume, ResumeToken: token}))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	w, ok := m.(*wire.Welcome)
	require.True(t, ok, "hello answered with %#v", m)
	return mux, ctrl, w
}

// rawRegister sends reg on ctrl and returns the answer (Registered or Rejected).
func rawRegister(t *testing.T, ctrl net.Conn, reg *wire.Register) wire.Message {
	t.Helper()
	require.NoError(t, wire.WriteFrame(ctrl, reg))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	return m
}

// remoteRecord returns edge e's record of tunnel id of edge from, once it has one.
func remoteRecord(t *testing.T, e *clusterEdge, from, id string) memberRecord {
	t.Helper()
	var rec memberRecord
	require.Eventually(t, func() bool {
		e.c.remote.mu.Lock()
		defer e.c.remote.mu.Unlock()
		re := e.c.remote.edges[from]
		if re == nil {
			return false
		}
		var ok bool
		rec, ok = re.records[id]
		return ok
	}, 5*time.Second, 10*time.Millisecond, "edge %s never learnt tunnel %s of edge %s", e.id, id, from)
	return rec
}

// A solo HTTP tunnel's edge dies; on another edge, while the dead edge's lease holds, only
// the connector that held the tunnel's session (it presents that session's resume token)
// may take the subdomain again: a session claiming the same session with a wrong token, or
// claiming none, is refused "already in use". NATS carries the token's SHA-256, not the token.
func TestClusterRecordsSoloResumeNeedsTheToken(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 5 * time.Second // the whole test runs within the dead edge's lease
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	solo := func(req uint32) *wire.Register {
		return &wire.Register{Req: req, Proto: group.ProtoHTTP, Label: "solo"}
	}

	_, ctrlA, welcome := rawHello(t, a.ControlAddr, "", "")
	reg, ok := rawRegister(t, ctrlA, solo(1)).(*wire.Registered)
	require.True(t, ok, "solo tunnel refused on a")
	rec := remoteRecord(t, b, "a", reg.TunnelID)
	proof := sha256.Sum256([]byte(welcome.ResumeToken))
	assert.Equal(t, welcome.SessionID, rec.Session)
	assert.Equal(t, hex.EncodeToString(proof[:]), rec.ResumeHash, "the record carries the token's SHA-256")
	assert.NotContains(t, rec.ResumeHash, welcome.ResumeToken)
	killed := time.Now()
	a.kill()

	inUse := func(m wire.Message, who string) {
		t.Helper()
		rej, ok := m.(*wire.Rejected)
		require.True(t, ok, "%s: registration answered with %#v", who, m)
		assert.Contains(t, rej.Message, "subdomain 'solo' is already in use", who)
	}
	// Another connector, and one that names the session with a wrong token, are refused.
	_, ctrl, _ := rawHello(t, b.ControlAddr, "", "")
	inUse(rawRegister(t, ctrl, solo(1)), "a connector without a resume claim")
	_, ctrl, _ = rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken+"x")
	inUse(rawRegister(t, ctrl, solo(1)), "a connector with a wrong resume token")
	_, ctrl, _ = rawHello(t, b.ControlAddr, "other-session", welcome.ResumeToken)
	inUse(rawRegister(t, ctrl, solo(1)), "the right token for another session")

	// The connector itself is taken at once.
	_, ctrl, _ = rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken)
	m := rawRegister(t, ctrl, solo(1))
	require.IsType(t, &wire.Registered{}, m, "the connector that held the session refused on b")
	require.Less(t, time.Since(killed), lease, "the dead edge's lease lapsed: the test proves nothing")
	b.c.remote.mu.Lock()
	_, stale := b.c.remote.edges["a"].records[reg.TunnelID]
	expired := b.c.remote.edges["a"].expired
	b.c.remote.mu.Unlock()
	require.True(t, stale && !expired, "the dead edge's record was gone: the test proves nothing")
}

// A pool's keys as other edges see them in its members' records: a key a member on another
// edge holds is admitted, and so is a rotation from the pool's newest key, as on one edge;
// a rotation from a key the pool has rotated away from, or a key nobody holds, is not.
func TestClusterRecordsPoolAdmitsAsOneEdge(t *testing.T) {
	k1, k2, k3 := group.HashKey("k1"), group.HashKey("k2"), group.HashKey("k3")
	old := memberRecord{Label: "pool", Group: "web", KeyHash: k1}
	rotated := memberRecord{Label: "pool", Group: "web", KeyHash: k2, PrevKeyHashes: []group.KeyHash{k1}}
	mid := []memberRecord{old, rotated}
	for _, tc := range []struct {
		name string
		recs []memberRecord
		key  group.KeyHash
		prev []group.KeyHash
		want bool
	}{
		{"the old key, still held", mid, k1, nil, true},
		{"the new key", mid, k2, nil, true},
		{"rotating from the new key", mid, k3, []group.KeyHash{k2}, true},
		{"rotating from the key the pool left", mid, k3, []group.KeyHash{k1}, false},
		{"a key nobody holds", mid, k3, nil, false},
		{"the old key once no member holds it", []memberRecord{rotated}, k1, nil, false},
		{"rotating from the only key", []memberRecord{old}, k2, []group.KeyHash{k1}, true},
	} {
		req := &group.JoinRequest{KeyHash: tc.key, PrevKeyHashes: tc.prev}
		assert.Equal(t, tc.want, poolAdmits(tc.recs, req), tc.name)
	}
}

// A rotated member's record carries its own key and the keys it held before, and the other
// edge joins it with them: its pool (still at the old key there) moves to the new key and
// keeps its old-key members, so that an old-key connector is admitted there too.
func TestClusterRecordsCarryRotationKeys(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	_, err := b.connect().Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "B1").URL))
	require.NoError(t, err)
	rotated := clusterPool("k2")
	rotated.PreviousGroupKeys = []string{"k1"}
	tun, err := a.connect().Forward(ctxT(t), rotated, hostPort(backend(t, "A2").URL))
	require.NoError(t, err)
	rec := remoteRecord(t, b, "a", tun.ID())
	assert.Equal(t, group.HashKey("k2"), rec.KeyHash)
	assert.Equal(t, []group.KeyHash{group.HashKey("k1")}, rec.PrevKeyHashes)
	b.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	require.Eventually(t, func() bool {
		g := b.Registry().Groups()
		return len(g) == 1 && g[0].KeyHash == group.HashKey("k2")
	}, 5*time.Second, 10*time.Millisecond, "b's pool did not move to the rotated key")
	// b's own member still holds k1: another k1 connector joins on either edge.
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "B2").URL))
	require.NoError(t, err)
	_, err = a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "A1").URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"a": 2, "b": 2})
	b.waitMembers(t, "pool", map[string]int{"a": 2, "b": 2})
	// A key no member holds is still refused.
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k3"), hostPort(backend(t, "X").URL))
	require.ErrorContains(t, err, "group key does not match")
}

// A connector that moves to another edge while its old edge lives (the old edge has not
// noticed that the connection died) is taken there at once, and its old edge, seeing the
// record that proves the move, ends the old session: the subdomain is not split between the
// two edges until a keepalive fails, and the old edge serves it through the new one.
func TestClusterRecordsMovedConnectorEndsItsOldSession(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	solo := &wire.Register{Req: 1, Proto: group.ProtoHTTP, Label: "solo"}

	muxA, ctrlA, welcome := rawHello(t, a.ControlAddr, "", "")
	reg, ok := rawRegister(t, ctrlA, solo).(*wire.Registered)
	require.True(t, ok, "solo tunnel refused on a")
	remoteRecord(t, b, "a", reg.TunnelID)

	// A wrong token ends nothing.
	_, ctrl, _ := rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken+"x")
	require.IsType(t, &wire.Rejected{}, rawRegister(t, ctrl, solo))

	_, ctrlB, _ := rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken)
	require.IsType(t, &wire.Registered{}, rawRegister(t, ctrlB, solo), "the moved connector refused on b")
	select {
	case <-muxA.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("edge a kept the session its connector left for edge b")
	}
	a.waitMembers(t, "solo", map[string]int{"b": 1})
	b.waitMembers(t, "solo", map[string]int{"b": 1})
}

// A rolling rotation of a TCP pool (the key is part of its route) across edges: the rotated
// member joins the pool on every edge on the pool's port, and an edge that learns the
// members afterwards, in whatever order, holds them all in one pool on that port.
func TestClusterRecordsTCPRotationAcrossEdges(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{host: "127.0.0.1"})
	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2"})
	spec := func(key string, prev ...string) tunnel.TunnelSpec {
		return tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: key, PreviousGroupKeys: prev}
	}
	t1, err := a.connect().Forward(ctxT(t), spec("k1"), tcpNamed(t, "db"))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), spec("k1"), tcpNamed(t, "db"))
	require.NoError(t, err)
	t2, err := a.connect().Forward(ctxT(t), spec("k2", "k1"), tcpNamed(t, "db"))
	require.NoError(t, err)
	require.Equal(t, t1.Port(), t2.Port())
	c := startClusterEdge(t, nodes, "c", clusterOpts{host: "127.0.0.3"})
	for _, e := range []*clusterEdge{a, b, c} {
		e.waitMembers(t, "db", map[string]int{"a": 2, "b": 1})
		var pools []group.Info
		for _, g := range e.Registry().Groups() {
			if g.Label == "db" {
				pools = append(pools, g)
			}
		}
		require.Len(t, pools, 1, "edge %s splits the pool", e.id)
		require.Equal(t, t1.Port(), pools[0].Port, "edge %s", e.id)
		got, err := readTCP(net.JoinHostPort(e.host, fmt.Sprint(t1.Port())))
		require.NoError(t, err)
		require.Equal(t, "db", got, "edge %s", e.id)
	}
}

// A solo tunnel's connector moving to another edge right after it registered (its edge
// stopped gracefully, so no record of it is left) gets its subdomain back at once: the
// route's solo claim is recent, but its holder is the session the connector resumed.
func TestClusterRecordsSoloMovesRightAfterItsClaim(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 5 * time.Second
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	_, err := a.connect(failoverDialer(a, b)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "moving"}, hostPort(backend(t, "M").URL))
	require.NoError(t, err)
	claimed := time.Now()
	a.close()
	require.Eventually(t, func() bool { return b.members("moving")["b"] == 1 }, lease-time.Second, 10*time.Millisecond,
		"the tunnel is not back on b within the lease of its claim")
	require.Less(t, time.Since(claimed), lease)
	code, body := b.get("moving", "/")
	require.Equal(t, 200, code)
	require.Equal(t, "M /", body)
}
