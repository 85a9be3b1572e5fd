package cluster

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// remoteView is what this edge knows of the other edges: their leases, their members'
// records, and which of those members are joined to this edge's registry.
//
// A remote member is joined (dispatch may pick it) only while its edge's lease holds and
// the edge-to-edge link to it is up: a member this edge cannot reach is no member of its
// pools. When the link breaks (the other edge died, or the network between them did), its
// members leave at once; when the lease lapses without the link breaking (the other edge
// lost NATS), they leave at LeaseTTL.
type remoteView struct {
	mu    sync.Mutex
	edges map[string]*remoteEdge
}

type remoteEdge struct {
	id        string
	advertise string
	started   time.Time
	lastSeen  time.Time // when a renewal of its lease was last seen (local clock)
	expired   bool
	records   map[string]memberRecord  // by tunnel id
	joined    map[string]*group.Member // the members joined to the registry
	refused   map[string]string        // records the registry refused, and why (logged once)
	link      *peerLink                // nil while there is no link
	dialing   bool
	// moved are the records whose connector has moved to this edge (movedHere): not joined,
	// though the record stays until its edge deletes it or its lease lapses.
	moved map[string]bool
	// unconfirmed are the records a restarted watch did not deliver, since when
	// (membersSynced): dropped a lease later unless delivered again.
	unconfirmed map[string]time.Time
}

func (v *remoteView) edge(id string) *remoteEdge {
	e := v.edges[id]
	if e == nil {
		e = &remoteEdge{id: id, records: map[string]memberRecord{}, joined: map[string]*group.Member{},
			refused: map[string]string{}, moved: map[string]bool{}, unconfirmed: map[string]time.Time{}, expired: true}
		v.edges[id] = e
	}
	return e
}

// watchLeases follows the leases bucket: every renewal of another edge's lease.
func (c *Cluster) watchLeases() {
	c.watch(c.leases, nil, c.onLease, nil)
}

// onLease handles a value of the leases bucket: a renewal of an edge's lease, or its deletion.
func (c *Cluster) onLease(key string, value []byte, deleted bool) {
	if key == c.cfg.EdgeID {
		if !deleted {
			c.selfSeen.Store(time.Now().UnixNano())
			c.checkOwnLease(value)
		}
		return
	}
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	e := c.remote.edge(key)
	if deleted {
		// A graceful stop: its members leave now.
		gone := routesOf(slices.Collect(maps.Values(e.records))...)
		e.expired = true
		e.records = map[string]memberRecord{}
		c.reconcileLocked(e)
		c.settleRoutes(gone)
		return
	}
	var rec leaseRecord
	if json.Unmarshal(value, &rec) != nil {
		c.log.Warn("malformed lease record ignored", zap.String("edge", key))
		return
	}
	restarted := !e.started.IsZero() && !rec.Started.Equal(e.started)
	e.advertise, e.started, e.lastSeen = rec.Advertise, rec.Started, time.Now()
	if e.expired {
		c.log.Info("edge joined the cluster", zap.String("edge", key), zap.String("advertise", rec.Advertise))
	}
	e.expired = false
	if restarted && e.link != nil {
		e.link.close()
	}
	for id, m := range e.joined {
		m.SetPeerLoad(rec.Loads[id])
	}
	c.reconcileLocked(e)
}

// checkOwnLease tells a second edge with this edge's edge_id: once this edge has seen its
// own renewal, a renewal of its key by another incarnation (another start time) can only
// come from a live edge sharing its edge_id. The two would take each other's members for
// their own records; the edge logs an error (at most once a minute) and /api/cluster
// carries a warning until the other edge stops renewing.
func (c *Cluster) checkOwnLease(value []byte) {
	var rec leaseRecord
	if json.Unmarshal(value, &rec) != nil {
		return
	}
	if rec.Started.Equal(c.started) && rec.Advertise == c.cfg.Advertise {
		c.ownSeen.Store(true)
		return
	}
	if !c.ownSeen.Load() {
		return // this edge's previous incarnation, before the first renewal
	}
	now := time.Now()
	c.dupSeen.Store(now.UnixNano())
	if last := c.dupLogged.Load(); last == 0 || now.Sub(time.Unix(0, last)) >= time.Minute {
		c.dupLogged.Store(now.UnixNano())
		c.log.Error("another edge renews this edge's lease: two edges share one edge_id; give each edge its own",
			zap.String("other_advertise", rec.Advertise), zap.Time("other_started", rec.Started))
	}
}

// duplicateWarning is /api/cluster's warning while another edge renewed this edge's lease
// within the last two lease periods, or "".
func (c *Cluster) duplicateWarning() string {
	at := c.dupSeen.Load()
	if at == 0 || time.Since(time.Unix(0, at)) > 2*c.cfg.LeaseTTL {
		return ""
	}
	return "another edge renews the lease of edge_id " + c.cfg.EdgeID + ": two edges share one edge_id; give each edge its own"
}

// watchMembers follows the members bucket: every other edge's member records.
func (c *Cluster) watchMembers() {
	c.watch(c.members, &c.membersRev, func(key string, value []byte, deleted bool) {
		c.onMemberRecord(key, value, deleted)
	}, c.membersSynced)
}

// onMemberRecord handles a value of the members bucket: a member record written or deleted.
func (c *Cluster) onMemberRecord(key string, value []byte, deleted bool) {
	edgeID, tunnelID, ok := strings.Cut(key, ".")
	if !ok {
		return
	}
	if edgeID == c.cfg.EdgeID {
		if deleted && c.edge.Registry().Lookup(tunnelID) != nil {
			// Another edge dropped this edge's record (its lease seemed lapsed) while
			// the member lives: write it again.
			c.Observe(group.Event{Member: group.MemberInfo{ID: tunnelID}})
		}
		return
	}
	var moved memberRecord // runs after the unlock below
	defer func() {
		if p, ok := proofOf(moved.ResumesProof); ok && moved.Resumes != "" {
			c.edge.EndMovedSession(moved.Resumes, moved.Tenant, p, moved.Edge)
		}
	}()
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	e := c.remote.edge(edgeID)
	delete(e.unconfirmed, tunnelID)
	var gone [][2]string
	if deleted {
		if rec, ok := e.records[tunnelID]; ok {
			gone = routesOf(rec)
		}
		delete(e.records, tunnelID)
	} else {
		var rec memberRecord
		if json.Unmarshal(value, &rec) != nil || rec.Tunnel != tunnelID || rec.Edge != edgeID {
			c.log.Warn("malformed member record ignored", zap.String("key", key))
			return
		}
		e.records[tunnelID] = rec
		moved = rec
	}
	c.reconcileLocked(e)
	c.settleRoutes(gone)
}

// routesMayBeLost is told, each time a members watch started and delivered the bucket's
// records, whether the members bucket was created anew or records this edge knew were
// missing: NATS restarted as a whole (the members bucket, in memory storage, lost them; in a
// cluster with no member anywhere only its new creation tells), and the route bucket may
// have lost writes too (a store missing its last writes). Then first claims of routes the edge does not know
// wait a lease, while the edges write back the routes they remember; else the hold the
// reconnection set ends. (A record deleted while the watch was down also counts: a hold
// for nothing, a lease long.)
func (c *Cluster) routesMayBeLost(restarted bool) {
	if restarted {
		if time.Now().UnixNano() < c.routesLostUntil.Load() {
			return // the same loss seen again (by the edge that created the buckets, then its watch): one hold
		}
		c.routesLostUntil.Store(time.Now().Add(c.cfg.LeaseTTL).UnixNano())
		c.edge.HoldNewRoutes(c.cfg.LeaseTTL)
		c.spawn(c.edge.RestoreLostRoutes)
		return
	}
	if time.Now().UnixNano() < c.routesLostUntil.Load() {
		return // evidence of lost writes within the last lease: the hold it set stands
	}
	c.edge.HoldNewRoutes(0)
}

// membersSynced runs when a members watch (re)started has delivered the bucket's current
// records: the records of other edges it did not deliver were deleted while no watch ran,
// or lost with a bucket created anew (whose edges write them again within a heartbeat).
// They are marked unconfirmed; dropUnconfirmed drops those not delivered again within a
// lease. reborn reports that the watch found the bucket created anew since it last started.
func (c *Cluster) membersSynced(current map[string]bool, reborn bool) {
	now := time.Now()
	missing := reborn
	c.remote.mu.Lock()
	for _, e := range c.remote.edges {
		for id := range e.records {
			if !current[e.id+"."+id] {
				missing = true
				if _, marked := e.unconfirmed[id]; !marked {
					e.unconfirmed[id] = now
				}
			}
		}
	}
	c.remote.mu.Unlock()
	c.routesMayBeLost(missing)
}

// dropUnconfirmedLocked drops e's records that no watch delivered again within a lease of
// being found missing from the bucket (membersSynced); the caller holds c.remote.mu.
func (c *Cluster) dropUnconfirmedLocked(e *remoteEdge, now time.Time) {
	var gone []memberRecord
	for id, since := range e.unconfirmed {
		if now.Sub(since) < c.cfg.LeaseTTL {
			continue
		}
		delete(e.unconfirmed, id)
		if rec, ok := e.records[id]; ok {
			gone = append(gone, rec)
			delete(e.records, id)
		}
	}
	if len(gone) > 0 {
		c.log.Info("member records deleted while the watch was down: their members leave", zap.String("edge", e.id), zap.Int("members", len(gone)))
		c.reconcileLocked(e)
		c.settleRoutes(routesOf(gone...))
	}
}

// watch runs fn for every value of kv, the current ones first, until the cluster stops;
// a watch that ends (NATS lost, or restartWatches) is started again. rev, when set, keeps
// the highest revision delivered. A watch that cannot start because its bucket does not
// exist (NATS restarted and lost it) creates the missing buckets again (recoverBuckets); one
// that starts on a bucket created anew since it last started (by any edge) has every local
// member's record written again, as the bucket lost them.
//
// synced, when set, gets the keys the bucket holds each time a watch (re)started has
// delivered the current values: what was deleted while no watch ran (or lost with a bucket
// created anew) is delivered by no watch, and synced forgets it; reborn tells it that the
// bucket was created anew since the watch last started.
func (c *Cluster) watch(kv jetstream.KeyValue, rev *atomic.Uint64, fn func(key string, value []byte, deleted bool),
	synced func(current map[string]bool, reborn bool)) {
	var born time.Time // when kv's stream was created, as this watch last found it
	for c.ctx.Err() == nil {
		w, err := kv.WatchAll(c.ctx)
		if err != nil {
			if c.recoverBuckets(err) {
				continue
			}
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		c.wmu.Lock()
		c.watchers[w] = struct{}{}
		c.wmu.Unlock()
		reborn := c.bucketReborn(kv, &born)
		if reborn {
			c.log.Warn("the NATS bucket was created anew: writing this edge's records again", zap.String("bucket", kv.Bucket()))
			c.bucketsGen.Add(1) // first: heartbeat then forgets the old bucket's last sequence
			if rev != nil {
				rev.Store(0) // the new bucket's revisions start again from 1
			}
			c.markAllDirty()
		}
		current := map[string]bool{} // the keys held when the watch started; nil once synced
		for entry := range w.Updates() {
			if entry == nil { // the current values have all been delivered
				if current != nil && synced != nil {
					synced(current, reborn)
				}
				current = nil
				continue
			}
			if current != nil && entry.Operation() == jetstream.KeyValuePut {
				current[entry.Key()] = true
			}
			if rev != nil && entry.Revision() > rev.Load() {
				rev.Store(entry.Revision()) // this goroutine alone writes it
			}
			fn(entry.Key(), entry.Value(), entry.Operation() != jetstream.KeyValuePut)
		}
		c.wmu.Lock()
		delete(c.watchers, w)
		c.wmu.Unlock()
		_ = w.Stop()
	}
}

// bucketReborn reports whether kv's stream was created after *born, the creation time found
// before, and records the one found now; it reports false when it cannot tell.
func (c *Cluster) bucketReborn(kv jetstream.KeyValue, born *time.Time) bool {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	st, err := kv.Status(ctx)
	if err != nil {
		return false
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return false
	}
	created := bs.StreamInfo().Created
	reborn := !born.IsZero() && !created.Equal(*born)
	*born = created
	return reborn
}

// restartWatches stops the running watches; watch starts each again at once, with the
// current values first. A watch's ordered consumer lives on one NATS node: when that node
// goes away the watch delivers nothing until the client notices, which can take longer
// than a lease, and meanwhile this edge would take every other edge for gone.
func (c *Cluster) restartWatches() {
	c.wmu.Lock()
	ws := make([]jetstream.KeyWatcher, 0, len(c.watchers))
	for w := range c.watchers {
		ws = append(ws, w)
	}
	c.wmu.Unlock()
	for _, w := range ws {
		_ = w.Stop()
	}
}

// viewFresh reports whether this edge's leases watch delivered its own last renewals: when
// it did not (NATS lost, or the watch stalled), no other edge's lease is taken for lapsed on
// its evidence; the edge keeps the remote members it knows and can reach, and a stalled
// watch is restarted (at most every LeaseTTL/2). A restarted watch makes the view fresh
// only once it delivered a renewal of this edge: restarting it is no evidence (before, the
// restart itself counted as a renewal seen, and the next check took every edge whose
// renewals the stalled watch had missed for lapsed; issue 28's nemesis, a NATS node killed).
func (c *Cluster) viewFresh() bool {
	seen, restarted := c.selfSeen.Load(), c.watchesRestarted.Load()
	stale := time.Since(time.Unix(0, seen))
	if stale < c.cfg.LeaseTTL/2 && seen > restarted {
		return true
	}
	if c.leaseOK.Load() && c.connected.Load() && stale >= c.cfg.LeaseTTL/2 &&
		time.Since(time.Unix(0, restarted)) >= c.cfg.LeaseTTL/2 {
		// Renewals are written but not seen: restart the watches, and give them a while.
		c.log.Warn("the leases watch missed this edge's own renewals: restarting the watches", zap.Duration("for", stale))
		c.watchesRestarted.Store(time.Now().UnixNano())
		c.restartWatches()
	}
	return false
}

// lapsed reports whether remote edge e's lease lapsed, now, on this edge's evidence: no
// renewal of it seen for LeaseTTL, while this edge's view was fresh (since freshSince)
// for LeaseTTL too. An edge is blamed only for renewals this edge could have seen: a
// watch that stalled and was restarted delivers the others' renewals again only some time
// after it delivered this edge's own.
func (c *Cluster) lapsed(e *remoteEdge, now, freshSince time.Time) bool {
	return !e.expired && now.Sub(e.lastSeen) >= c.cfg.LeaseTTL && now.Sub(freshSince) >= c.cfg.LeaseTTL
}

// checkLeases expires the edges whose lease was not renewed for LeaseTTL.
func (c *Cluster) checkLeases() {
	t := time.NewTicker(max(c.cfg.LeaseTTL/10, 50*time.Millisecond))
	defer t.Stop()
	var freshSince time.Time // zero while the view is not fresh
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		if !c.viewFresh() {
			freshSince = time.Time{}
			continue
		}
		now := time.Now()
		if freshSince.IsZero() {
			freshSince = now
		}
		c.remote.mu.Lock()
		for _, e := range c.remote.edges {
			c.dropUnconfirmedLocked(e, now)
			if c.lapsed(e, now, freshSince) {
				e.expired = true
				c.log.Warn("edge lease lapsed: its members leave", zap.String("edge", e.id), zap.Int("members", len(e.joined)))
				if e.link != nil {
					e.link.close()
				}
				c.reconcileLocked(e)
				c.settleRoutes(routesOf(slices.Collect(maps.Values(e.records))...))
				// Its records are garbage now; any edge may delete them (its next run, or
				// the edge itself when its lease is renewed again, writes them anew).
				ids := make([]string, 0, len(e.records))
				for id := range e.records {
					ids = append(ids, e.id+"."+id)
				}
				c.spawn(func() { c.deleteRecords(ids) })
			}
		}
		c.remote.mu.Unlock()
	}
}

func (c *Cluster) deleteRecords(keys []string) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	for _, k := range keys {
		_ = c.members.Delete(ctx, k)
	}
}

// reconcileLocked makes the registry hold exactly e's members that may be dispatched to:
// all of its records while its lease holds and the link is up, none otherwise.
func (c *Cluster) reconcileLocked(e *remoteEdge) {
	c.rebuildLiveLocked()
	up := !e.expired && e.link != nil
	for id, m := range e.joined {
		rec, ok := e.records[id]
		if up && ok && !e.moved[id] && e.current(rec) && sameMember(rec, m) {
			continue
		}
		delete(e.joined, id)
		c.leaveRemote(m)
	}
	if !up {
		if !e.expired && len(e.records) > 0 && !e.dialing && e.link == nil && c.ctx.Err() == nil {
			e.dialing = true
			if !c.spawn(func() { c.dial(e.id) }) {
				e.dialing = false
			}
		}
		return
	}
	for id, rec := range e.records {
		if !e.moved[id] && e.current(rec) {
			c.applyRecordLocked(e, id, rec)
		}
	}
	e.forgetDeletedRecords()
}

// current reports whether rec was written by the incarnation of e whose lease this edge saw
// last (or says nothing of its incarnation): a previous run's record names members that
// are gone.
func (e *remoteEdge) current(rec memberRecord) bool {
	return rec.Started.IsZero() || e.started.IsZero() || rec.Started.Equal(e.started)
}

// applyRecordLocked makes the registry's member for e's record rec (of tunnel id) match it:
// joined, unless the registry refuses it (logged once per reason), as healthy as rec says,
// and draining once rec is.
func (c *Cluster) applyRecordLocked(e *remoteEdge, id string, rec memberRecord) {
	m := e.joined[id]
	if m == nil {
		var err error
		if m, err = c.joinRemote(e, rec); err != nil {
			if e.refused[id] != err.Error() {
				e.refused[id] = err.Error()
				c.log.Warn("a remote member cannot join this edge's pool", zap.String("edge", e.id),
					zap.String("tunnel", id), zap.String("label", rec.Label), zap.Error(err))
			}
			return
		}
		delete(e.refused, id)
		e.joined[id] = m
	}
	if m.HealthKind != "none" && m.Healthy() != rec.Healthy {
		c.edge.Registry().SetHealth(m, rec.Healthy, remoteReason(e.id, rec.Healthy))
	}
	if rec.Draining && !m.Draining() {
		c.edge.Registry().Drain(m)
		if t, ok := m.Value().(*proxy.Tunnel); ok {
			// Its edge waits for the streams this edge has open to it; closing them writes
			// to the link: not under the remote view's lock.
			c.spawn(t.CloseIdle)
		}
	}
}

// forgetDeletedRecords drops what e keeps of records it no longer has: why the registry
// refused them, and that their connector moved here.
func (e *remoteEdge) forgetDeletedRecords() {
	for id := range e.refused {
		if _, ok := e.records[id]; !ok {
			delete(e.refused, id)
		}
	}
	for id := range e.moved {
		if _, ok := e.records[id]; !ok {
			delete(e.moved, id)
		}
	}
}

func remoteReason(edge string, healthy bool) string {
	if healthy {
		return "healthy on edge " + edge
	}
	return "unhealthy on edge " + edge
}

// sameMember reports whether the joined member m still matches rec in what joining set.
func sameMember(rec memberRecord, m *group.Member) bool {
	g := m.Group()
	return g.Label == rec.Label && g.Proto == rec.Proto && (rec.Port == 0 || g.Port == rec.Port) &&
		m.Weight == max(rec.Weight, 1) && m.Priority == rec.Priority
}

// maxTransportLen bounds the transport name a remote record may give its member ("websocket"
// is the longest the edges know).
const maxTransportLen = 16

// joinRemote joins one remote member to the registry, reached over e's link, with the keys
// its connector presented (its key and, mid-rotation, its previous ones): the pool here
// admits it, and rotates, as the pool on its own edge did.
func (c *Cluster) joinRemote(e *remoteEdge, rec memberRecord) (*group.Member, error) {
	t := proxy.NewTunnel(e.link.ctx, rec.Tunnel, rec.Proto, mux.Yamux(e.link.sess), nil)
	t.SetBackendProtocol(rec.BackendProtocol)
	if e.link.resets != nil {
		t.SetStreamReset(e.link.resets.Reset)
	}
	req := group.JoinRequest{ID: rec.Tunnel, Proto: rec.Proto, Label: rec.Label, Group: rec.Group,
		KeyHash: rec.KeyHash, PrevKeyHashes: rec.PrevKeyHashes, HealthKind: rec.HealthKind, AlertWebhook: rec.AlertWebhook, Tenant: rec.Tenant,
		Name: wire.CleanDisplay(rec.Name, wire.MaxNameLen), Host: wire.CleanDisplay(rec.Host, wire.MaxHostLen),
		Transport: wire.CleanDisplay(rec.Transport, maxTransportLen),
		Port:      rec.Port, Weight: rec.Weight, Priority: rec.Priority, SlowStart: rec.SlowStart,
		Affinity: rec.Affinity, RetryIdempotent: rec.RetryIdempotent, Edge: e.id, Value: t}
	m, err := c.edge.Registry().Join(req)
	if err != nil {
		t.Close()
		return nil, err
	}
	if rec.Port != 0 && m.Group().Port != rec.Port {
		// The pool's port here is not the one it has on its edge: a TCP pool must have one
		// port on every edge, so this edge does not serve it through that member.
		c.leaveRemote(m)
		return nil, errors.New("cluster: the pool has another public port on this edge")
	}
	return m, nil
}

// movedHere takes out of this edge's pools the members of other edges whose connector is
// the one registering here: it resumed their session with its token (heldBy). That
// connector has left them; they stay out (their records stay, counting the route as live)
// until their edge deletes them (it ends the session on seeing this edge's record that
// proves the move: endMovedSession) or its lease lapses. Without it a moved connector would
// find its own old registration, joined here over a link that is still up, in the way.
func (c *Cluster) MovedHere(session, tenant string, proof [32]byte) {
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	for _, e := range c.remote.edges {
		n := 0
		for id, rec := range e.records {
			if !e.moved[id] && rec.heldBy(session, tenant, proof) {
				e.moved[id] = true
				n++
			}
		}
		if n > 0 {
			c.log.Info("a connector moved here from another edge: its members there leave this edge's pools",
				zap.String("edge", e.id), zap.String("session", session), zap.Int("members", n))
			c.reconcileLocked(e)
		}
	}
}

// proofOf decodes a record's hex SHA-256 (ResumeHash, ResumesProof).
func proofOf(s string) (p [32]byte, ok bool) {
	if hex.DecodedLen(len(s)) != len(p) {
		return p, false
	}
	_, err := hex.Decode(p[:], []byte(s))
	return p, err == nil
}

// heldBy reports whether rec's member belongs to connector session session, of tenant, and
// proof is the SHA-256 of that session's resume token: the connector presenting it is the
// one that held the session (memberRecord).
func (rec memberRecord) heldBy(session, tenant string, proof [32]byte) bool {
	if rec.Session == "" || rec.Session != session || rec.Tenant != tenant {
		return false
	}
	h, ok := proofOf(rec.ResumeHash)
	return ok && subtle.ConstantTimeCompare(h[:], proof[:]) == 1
}

// poolAdmits reports whether req's keys let it join the pool whose members on other edges
// are recs, by the rule of one edge (group/rotate.go): its key is one a member holds, or one
// of its previous keys is the pool's key. The pool's key is the newest its members hold: one
// that no member declares it rotated from.
func poolAdmits(recs []memberRecord, req *group.JoinRequest) bool {
	older := map[group.KeyHash]bool{}
	for _, rec := range recs {
		if rec.KeyHash == req.KeyHash {
			return true
		}
		for _, p := range rec.PrevKeyHashes {
			older[p] = true
		}
	}
	for _, rec := range recs {
		if !older[rec.KeyHash] && slices.Contains(req.PrevKeyHashes, rec.KeyHash) {
			return true
		}
	}
	return false
}

func (c *Cluster) leaveRemote(m *group.Member) {
	c.edge.Registry().Leave(m)
	c.edge.LeftPool(m.Group())
	if t, ok := m.Value().(*proxy.Tunnel); ok {
		// Closing its streams writes to the link: not under the remote view's lock, which
		// the callers hold.
		if !c.spawn(t.Close) {
			t.Close() // the cluster is stopping: its workers are gone, nobody waits on the view
		}
	}
}

// leaveAll takes every remote member out of the registry (the cluster stops).
func (v *remoteView) leaveAll(c *Cluster) {
	v.mu.Lock()
	var tunnels []*proxy.Tunnel
	for _, e := range v.edges {
		for id, m := range e.joined {
			delete(e.joined, id)
			c.edge.Registry().Leave(m)
			c.edge.LeftPool(m.Group())
			if t, ok := m.Value().(*proxy.Tunnel); ok {
				tunnels = append(tunnels, t)
			}
		}
	}
	v.mu.Unlock()
	for _, t := range tunnels {
		t.Close()
	}
}

// dial keeps trying to link to edge id while its lease holds and it has members.
func (c *Cluster) dial(id string) {
	backoff := 50 * time.Millisecond
	for {
		c.remote.mu.Lock()
		e := c.remote.edges[id]
		if e == nil || e.expired || len(e.records) == 0 || c.ctx.Err() != nil {
			if e != nil {
				e.dialing = false
			}
			c.remote.mu.Unlock()
			return
		}
		addr := e.advertise
		c.remote.mu.Unlock()
		l, err := c.dialPeer(addr, id)
		c.remote.mu.Lock()
		if err == nil {
			if e.expired || c.ctx.Err() != nil {
				e.dialing = false
				c.remote.mu.Unlock()
				l.close()
				return
			}
			e.dialing = false
			e.link = l
			c.log.Info("linked to edge", zap.String("edge", id), zap.String("addr", addr))
			c.reconcileLocked(e)
			c.remote.mu.Unlock()
			c.spawn(func() { c.watchLink(e, l) })
			return
		}
		c.remote.mu.Unlock()
		c.log.Debug("cannot link to edge; retrying", zap.String("edge", id), zap.String("addr", addr), zap.Error(err))
		select {
		case <-c.ctx.Done():
			c.remote.mu.Lock()
			e.dialing = false
			c.remote.mu.Unlock()
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// watchLink waits for l to end; e's members then leave, and a new link is dialled while
// e's lease holds.
func (c *Cluster) watchLink(e *remoteEdge, l *peerLink) {
	select {
	case <-l.sess.CloseChan():
	case <-c.ctx.Done(): // the cluster stops (its links may have left the set already)
	}
	l.close()
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	if e.link != l {
		return
	}
	e.link = nil
	if c.ctx.Err() == nil {
		c.log.Warn("link to edge lost: its members leave this edge's pools until it is back", zap.String("edge", e.id))
	}
	c.reconcileLocked(e)
}

// info describes the cluster for GET /api/cluster.
func (c *Cluster) Status() tunnel.ClusterStatus {
	out := tunnel.ClusterStatus{Enabled: true, Self: c.cfg.EdgeID, NATS: c.nc.IsConnected()}
	if w := c.duplicateWarning(); w != "" {
		out.Warnings = append(out.Warnings, w)
	}
	local := 0
	for _, g := range c.edge.Registry().Groups() {
		for _, m := range g.Members() {
			if m.Edge == "" {
				local++
			}
		}
	}
	lease := "held"
	if !c.leaseOK.Load() {
		lease = "not renewed"
	}
	out.Edges = append(out.Edges, tunnel.ClusterEdgeStatus{ID: c.cfg.EdgeID, Advertise: c.cfg.Advertise, Self: true,
		Lease: lease, Members: local})
	c.remote.mu.Lock()
	var others []tunnel.ClusterEdgeStatus
	for _, e := range c.remote.edges {
		if e.started.IsZero() && len(e.records) == 0 {
			continue
		}
		ce := tunnel.ClusterEdgeStatus{ID: e.id, Advertise: e.advertise, LastRenewal: e.lastSeen, Members: len(e.joined)}
		switch {
		case e.expired:
			ce.Lease = "expired"
		case e.link == nil && len(e.records) > 0: // an edge with no member is not linked to
			ce.Lease = "unreachable"
		default:
			ce.Lease = "held"
		}
		others = append(others, ce)
	}
	c.remote.mu.Unlock()
	slices.SortFunc(others, func(a, b tunnel.ClusterEdgeStatus) int { return strings.Compare(a.ID, b.ID) })
	out.Edges = append(out.Edges, others...)
	return out
}
