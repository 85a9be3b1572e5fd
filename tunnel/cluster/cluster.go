package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/natsstore"
)

// Cluster is an edge's part in a cluster of edges sharing one NATS JetStream.
//
// What lives where:
//   - <bucket>_routes (natsstore.Store): route ownership, key hashes and TCP ports, written with
//     compare-and-set before a registration is acknowledged, as the single edge writes its
//     file store.
//   - <bucket>_leases: one key per edge, "<edge id>", renewed every heartbeat; its value
//     is the edge's advertised address, its start time and the published stream counts of
//     its members. An edge whose renewal is not seen for LeaseTTL is gone: its members leave.
//   - <bucket>_members: one key per member, "<edge id>.<tunnel id>", the member's record
//     (route, pool settings, health bit, draining). Written by the member's edge when it
//     changes; watched by every other edge, which joins the member to its own registry as
//     a remote member reached over the edge-to-edge link (remote.go).
//   - <bucket>_alerts: one key per pool, the last alert sent, so that a pool that falls to
//     zero healthy members across all edges fires one alert, not one per edge.
type Cluster struct {
	edge tunnel.ClusterEdge
	cfg  Config
	log  *zap.Logger
	// joined is set by Join; leaveOnce makes Leave's first call the one that counts.
	joined    bool
	leaveOnce sync.Once

	nc      *nats.Conn
	ownConn bool
	routes  *natsstore.Store
	members jetstream.KeyValue
	leases  jetstream.KeyValue
	alerts  jetstream.KeyValue
	// bmu serialises ensureBuckets; bucketsSeen is when it last found all three buckets;
	// bucketsGen counts the times this edge found a bucket created anew.
	bmu         sync.Mutex
	bucketsSeen time.Time
	bucketsGen  atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// spawnMu and stopped keep goroutines from being added once Leave waits for them;
	// listeners are the peer listeners ServePeers serves, closed by Leave.
	spawnMu   sync.Mutex
	stopped   bool
	listeners map[net.Listener]struct{}
	// started is this incarnation's start, in its lease: a change tells the others that
	// the edge restarted.
	started time.Time
	// staleDropped: the records a previous incarnation left are deleted (dropStaleOwnRecords).
	staleDropped atomic.Bool

	// pmu guards the publisher's state: the local members whose record must be written.
	pmu   sync.Mutex
	dirty map[string]bool
	kick  chan struct{}
	// connected is whether the NATS connection is up now.
	connected atomic.Bool
	// selfSeen is when this edge last saw its own lease renewed through its leases watch
	// (unix nanoseconds): a watch that stopped delivering (its consumer was on a NATS node
	// that went away) shows as renewals written but not seen (edge_cluster_remote.go).
	selfSeen atomic.Int64
	// watchesRestarted is when viewFresh last restarted the watches for missing this edge's
	// own renewals (unix nanoseconds): until the restarted leases watch delivers a renewal
	// (selfSeen after it), the view is not fresh.
	watchesRestarted atomic.Int64
	// membersRev is the last revision the members watch delivered; membersPrev is the
	// members stream's last sequence at the previous heartbeat, and membersBorn its creation
	// time then (both heartbeat's own).
	membersRev  atomic.Uint64
	membersPrev uint64
	membersBorn time.Time
	// routesLostUntil is, when this edge last saw evidence that NATS lost writes (a bucket
	// created anew, member records missing), plus a lease (unix nanoseconds): until then a
	// members watch that finds nothing missing does not end the hold that evidence set.
	routesLostUntil atomic.Int64
	// wmu guards watchers, the watches running now, stopped to restart them.
	wmu      sync.Mutex
	watchers map[jetstream.KeyWatcher]struct{}
	// leaseOK is whether the last lease renewal was written.
	leaseOK atomic.Bool
	// ownSeen: the leases watch delivered this incarnation's own renewal; dupSeen and
	// dupLogged: when another edge's renewal of this edge's lease was last seen and logged
	// (unix nanoseconds; checkOwnLease).
	ownSeen            atomic.Bool
	dupSeen, dupLogged atomic.Int64

	remote remoteView
	peers  peerSet
	// preAuth caps the incoming edge-to-edge connections whose handshake is under way.
	preAuth *throttle.Conns
	// live is the set of route keys with members on other edges, with their tenant
	// (liveAnywhere, liveTenant).
	live atomic.Pointer[map[string]string] // route key -> the tenant of its members
}

// memberRecord is a member as the other edges learn it.
//
// Name and Host are the member's tunnel name and its connector's host, shown beside its id:
// absent from the records of older edges (the member is then shown without them), ignored
// by older edges. The edge that reads them cleans them again (wire.CleanDisplay).
//
// KeyHash is the group key hash the member presented and PrevKeyHashes the ones it declared
// it held before (key rotation): the other edges join it with both, so that a pool in the
// middle of a rolling rotation admits on every edge what it admits on the member's own.
//
// Session is the member's connector session on its edge and ResumeHash the hex SHA-256 of
// that session's resume token: a connector that moves to another edge and proves, with the
// token, that it held the session, is not refused by its own old registrations there
// (remoteConflict). The token is 128 random bits: its hash does not give it away. Resumes
// and ResumesProof are that claim, when the member's session made one: the session its
// connector resumed and the SHA-256 of the token it presented. The edge holding that session
// ends it when the proof matches (the connector has left it; endMovedSession).
type memberRecord struct {
	Edge            string          `json:"edge"`
	Tunnel          string          `json:"tunnel"`
	Proto           group.Proto     `json:"proto"`
	Label           string          `json:"label"`
	Group           string          `json:"group,omitempty"`
	KeyHash         group.KeyHash   `json:"key_hash"`
	PrevKeyHashes   []group.KeyHash `json:"prev_key_hashes,omitempty"`
	Session         string          `json:"session,omitempty"`
	ResumeHash      string          `json:"resume_hash,omitempty"`
	Resumes         string          `json:"resumes,omitempty"`
	ResumesProof    string          `json:"resumes_proof,omitempty"`
	Tenant          string          `json:"tenant,omitempty"`
	Name            string          `json:"name,omitempty"`
	Host            string          `json:"host,omitempty"`
	Transport       string          `json:"transport,omitempty"`
	HealthKind      string          `json:"health_kind"`
	Healthy         bool            `json:"healthy"`
	Draining        bool            `json:"draining,omitempty"`
	Port            int             `json:"port,omitempty"`
	Weight          int             `json:"weight,omitempty"`
	Priority        int             `json:"priority,omitempty"`
	SlowStart       time.Duration   `json:"slow_start,omitempty"`
	Affinity        string          `json:"affinity,omitempty"`
	RetryIdempotent bool            `json:"retry_idempotent,omitempty"`
	AlertWebhook    string          `json:"alert_webhook,omitempty"`
	BackendProtocol string          `json:"backend_protocol,omitempty"`
	// Started is the start of the edge incarnation that wrote the record (its lease's
	// Started): the others join only the records of the incarnation whose lease they see, so
	// that the records a killed edge left, until its next run deletes them, send nothing to
	// members that are gone. Zero in a record of an older version: joined as before.
	Started time.Time `json:"started,omitzero"`
}

// leaseRecord is an edge's lease value.
type leaseRecord struct {
	Advertise string           `json:"advertise"`
	Started   time.Time        `json:"started"`
	Loads     map[string]int64 `json:"loads,omitempty"`
}

// New checks cfg, fills in its defaults and returns a Cluster for one edge's
// ServerConfig.Cluster. It connects nothing: the edge's NewServer joins it.
func New(cfg Config) (*Cluster, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, dirty: map[string]bool{}, kick: make(chan struct{}, 1)}
	c.remote.edges = map[string]*remoteEdge{}
	c.watchers = map[jetstream.KeyWatcher]struct{}{}
	c.peers.links = map[*peerLink]struct{}{}
	return c, nil
}

// Join implements tunnel.Cluster: it connects to NATS (unless Config.NATSConn is set) and
// opens the buckets, and returns the route store.
func (c *Cluster) Join(edge tunnel.ClusterEdge) (store.Store, error) {
	if c.joined {
		return nil, errors.New("cluster: a Cluster serves one edge: it was joined already")
	}
	c.joined = true
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.edge, c.started = edge, time.Now()
	c.log = edge.Logger().Named("cluster").With(zap.String("edge_id", c.cfg.EdgeID))
	total, perAddr := edge.PreAuthLimits()
	c.preAuth = throttle.NewConns(throttle.ConnsConfig{
		Max:       total,
		MaxPerKey: perAddr,
		What:      "edge links waiting to authenticate",
		Logger:    edge.Logger().Named("throttle"),
	})
	c.nc = c.cfg.NATSConn
	if c.nc == nil {
		opts := append([]nats.Option{
			nats.Name("warren-edge-" + c.cfg.EdgeID),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond),
			nats.Timeout(c.cfg.Timeout),
			// A NATS server that hangs (a frozen host, a process stopped) keeps its TCP
			// connection: the client would leave it only after two unanswered pings, by
			// default two minutes apart, while this edge's lease lapsed on the others and it
			// refused every registration, the cluster's other nodes serving all along. With a
			// ping every sixth of a lease (at least 250 ms apart, so that a short lease on a
			// busy machine does not make it leave live servers), it moves to another node
			// within half a lease.
			nats.PingInterval(max(c.cfg.LeaseTTL/6, 250*time.Millisecond)),
			nats.MaxPingsOutstanding(2),
		}, c.cfg.NATSOptions...)
		nc, err := nats.Connect(strings.Join(c.cfg.NATSURLs, ","), opts...)
		if err != nil {
			c.cancel()
			return nil, fmt.Errorf("cluster: connect to NATS %v: %w", c.cfg.NATSURLs, err)
		}
		c.nc, c.ownConn = nc, true
	}
	c.connected.Store(c.nc.IsConnected())
	if err := c.openBuckets(); err != nil {
		c.cancel()
		c.closeConn()
		return nil, err
	}
	return c.routes, nil
}

func (c *Cluster) openBuckets() error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	var err error
	if c.routes, err = natsstore.Open(ctx, c.nc, natsstore.Config{Bucket: c.cfg.Bucket + "_routes",
		Replicas: c.cfg.Replicas, Timeout: c.cfg.Timeout}); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	kvs := make([]jetstream.KeyValue, 0, 3)
	for _, cfg := range c.bucketConfigs() {
		kv, _, err := openKV(ctx, js, cfg)
		if err != nil {
			return err // "cluster: open NATS bucket ..."
		}
		kvs = append(kvs, kv)
	}
	c.members, c.leases, c.alerts = kvs[0], kvs[1], kvs[2]
	c.bucketsSeen = time.Now()
	return nil
}

// Start implements tunnel.Cluster: it starts the workers (lease renewal, the member
// publisher, the watches, the lease checker). The edge's registry and routes exist by now.
func (c *Cluster) Start() error {
	c.nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
		c.connected.Store(false)
		// NATS may come back having lost writes (restarted as a whole): until what this edge
		// remembers is written back, a route missing from the store is taken for lost.
		c.edge.HoldNewRoutes(c.cfg.LeaseTTL)
		c.log.Warn("NATS connection lost: serving the routes and members known; new routes are refused until it returns", zap.Error(err))
	})
	c.nc.SetReconnectHandler(func(*nats.Conn) {
		// Until the members watch, started again below, tells whether NATS restarted as a
		// whole (routesMayBeLost), first claims of routes this edge does not know wait.
		c.edge.HoldNewRoutes(c.cfg.LeaseTTL)
		c.connected.Store(true)
		c.log.Info("NATS connection back: reconciling")
		c.restartWatches() // their consumers may have lived on the node that went away
		c.markAllDirty()
		// A NATS that restarted lost the buckets in memory storage: create them again (in a
		// goroutine: this handler runs on the connection's dispatcher).
		c.spawn(func() { c.reviveBuckets() })
		// The others may have given away this edge's solo TCP ports meanwhile.
		c.spawn(c.edge.ReclaimSoloPorts)
		// The routes this edge remembers that a NATS restarted from stores missing their
		// last writes lost are written back.
		c.spawn(c.edge.RestoreLostRoutes)
	})
	c.selfSeen.Store(time.Now().UnixNano())
	// A previous incarnation of this edge id may have left member records behind.
	c.staleDropped.Store(c.dropStaleOwnRecords())
	if err := c.renewLease(); err != nil {
		return fmt.Errorf("cluster: writing this edge's lease: %w", err)
	}
	c.leaseOK.Store(true)
	c.wg.Go(c.heartbeat)
	c.wg.Go(c.publisher)
	c.wg.Go(c.watchLeases)
	c.wg.Go(c.watchMembers)
	c.wg.Go(c.checkLeases)
	c.wg.Go(c.logThrottled)
	return nil
}

// Leave implements tunnel.Cluster: it stops the workers, the links and the peer listeners.
// Graceful: this edge's records and lease are deleted so that the others drop its members at
// once rather than after the lease. Only the first call counts.
func (c *Cluster) Leave(graceful bool) {
	c.leaveOnce.Do(func() { c.leave(graceful) })
}

func (c *Cluster) leave(graceful bool) {
	if !c.joined {
		return
	}
	if graceful && c.connected.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		c.pmu.Lock()
		c.dirty = map[string]bool{}
		c.pmu.Unlock()
		if keys, err := c.ownKeys(ctx); err == nil {
			for _, k := range keys {
				_ = c.members.Delete(ctx, k)
			}
		}
		_ = c.leases.Delete(ctx, c.cfg.EdgeID)
		cancel()
	}
	c.spawnMu.Lock()
	c.stopped = true
	listeners := c.listeners
	c.listeners = nil
	c.spawnMu.Unlock()
	for l := range listeners {
		_ = l.Close()
	}
	c.peers.closeAll() // before the cancel, which takes dialled links out of the set
	c.cancel()
	c.wg.Wait()
	c.remote.leaveAll(c)
	c.preAuth.Flush(true)
	c.closeConn()
}

// EdgeID implements tunnel.Cluster.
func (c *Cluster) EdgeID() string { return c.cfg.EdgeID }

// Lease implements tunnel.Cluster: Config.LeaseTTL.
func (c *Cluster) Lease() time.Duration { return c.cfg.LeaseTTL }

// PeerAddr implements tunnel.Cluster: Config.PeerAddr.
func (c *Cluster) PeerAddr() string { return c.cfg.PeerAddr }

// SettleLater implements tunnel.Cluster.
func (c *Cluster) SettleLater(kind, label string) { c.settleRoutes([][2]string{{kind, label}}) }

// logThrottled writes the peer port's aggregate throttle log lines every interval until the
// cluster stops (Leave writes what is left).
func (c *Cluster) logThrottled() {
	t := time.NewTicker(c.edge.AuthThrottle().LogInterval())
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.preAuth.Flush(false)
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *Cluster) closeConn() {
	if c.ownConn {
		c.nc.Close()
	}
}

// heartbeat renews the lease every third of LeaseTTL (at most every second, so that the
// published loads stay fresh).
func (c *Cluster) heartbeat() {
	every := min(c.cfg.LeaseTTL/3, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	gen := c.bucketsGen.Load()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		err := c.renewLease()
		if err != nil {
			if c.leaseOK.Swap(false) {
				c.log.Warn("cannot renew this edge's lease", zap.Error(err))
			}
			continue
		}
		if !c.staleDropped.Load() {
			c.staleDropped.Store(c.dropStaleOwnRecords())
		}
		if !c.leaseOK.Swap(true) {
			// The lease may have lapsed meanwhile, and the others dropped this edge's
			// records: write them all again.
			c.log.Info("lease renewed again")
			c.markAllDirty()
			c.spawn(c.edge.ReclaimSoloPorts)
		}
		if g := c.bucketsGen.Load(); g != gen {
			// The buckets were created anew, their revisions from 1: the members stream's
			// last sequence seen before says nothing of the new one.
			gen = g
			c.membersPrev = 0
		}
		c.checkMembersWatch()
	}
}

// checkMembersWatch restarts the watches when the members watch has not delivered what the
// members stream held a heartbeat ago: its consumer was on a NATS node that went away, and
// the client would notice only after many seconds, while the other edges' members changed.
// It restarts them too when the members stream is not the one the watch follows: it was
// created anew (by this edge, another edge or the operator), which shows as another
// creation time or as a last sequence below the revision the watch delivered (the old
// stream's); the counters then start again from the new stream. A members bucket found
// missing is created again (recoverBuckets).
func (c *Cluster) checkMembersWatch() {
	// Read before the stream's last sequence, which is then at least this revision of the
	// same stream, whatever the watch delivers meanwhile.
	delivered := c.membersRev.Load()
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	st, err := c.members.Status(ctx)
	if err != nil {
		if c.recoverBuckets(err) {
			c.membersPrev, c.membersBorn = 0, time.Time{}
		}
		return
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return
	}
	last, born := bs.StreamInfo().State.LastSeq, bs.StreamInfo().Created
	reborn := !c.membersBorn.IsZero() && !born.Equal(c.membersBorn)
	c.membersBorn = born
	if reborn || last < delivered {
		c.log.Warn("the members bucket was created anew under the members watch: restarting the watches",
			zap.Uint64("delivered", delivered), zap.Uint64("last", last), zap.Bool("created_anew", reborn))
		// The watch, started again, finds the new stream (bucketReborn), starts its revision
		// from 0 and has this edge's records written again; the counter is reset here too so
		// that the next heartbeat does not judge the new stream by the old one's revision.
		c.membersRev.Store(0)
		c.membersPrev = 0
		c.restartWatches()
		return
	}
	if prev := c.membersPrev; prev > 0 && c.membersRev.Load() < prev {
		c.log.Warn("the members watch is behind the members bucket: restarting the watches",
			zap.Uint64("delivered", c.membersRev.Load()), zap.Uint64("written", prev))
		c.restartWatches()
	}
	c.membersPrev = last
}

func (c *Cluster) renewLease() error {
	rec := leaseRecord{Advertise: c.cfg.Advertise, Started: c.started, Loads: c.loads()}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	_, err = c.leases.Put(ctx, c.cfg.EdgeID, b)
	if err != nil && c.recoverBuckets(err) {
		_, err = c.leases.Put(ctx, c.cfg.EdgeID, b) // into the bucket just created again
	}
	return err
}

// loads are the stream counts of this edge's own members, without the streams other
// edges forward to them (those edges count them themselves).
func (c *Cluster) loads() map[string]int64 {
	out := map[string]int64{}
	for _, g := range c.edge.Registry().Groups() {
		for _, m := range g.Members() {
			if m.Edge != "" {
				continue
			}
			if n := m.OwnActive(); n > 0 {
				out[m.ID] = n
			}
		}
	}
	return out
}

// observe is called for every group event: a change of a local member is published.
func (c *Cluster) Observe(ev group.Event) {
	if ev.Member.Edge != "" || ev.Member.ID == "" {
		return
	}
	c.pmu.Lock()
	c.dirty[ev.Member.ID] = true
	c.pmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Cluster) markAllDirty() {
	c.pmu.Lock()
	for _, g := range c.edge.Registry().Groups() {
		for _, m := range g.Members() {
			if m.Edge == "" {
				c.dirty[m.ID] = true
			}
		}
	}
	c.pmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// publisher writes the records of the local members that changed; a write that fails is
// tried again a moment later, and all of them when the NATS connection returns.
func (c *Cluster) publisher() {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		}
		c.pmu.Lock()
		ids := make([]string, 0, len(c.dirty))
		for id := range c.dirty {
			ids = append(ids, id)
		}
		clear(c.dirty)
		c.pmu.Unlock()
		var failed []string
		for _, id := range ids {
			if err := c.publish(id); err != nil {
				failed = append(failed, id)
			}
		}
		if len(failed) > 0 {
			c.pmu.Lock()
			for _, id := range failed {
				c.dirty[id] = true
			}
			c.pmu.Unlock()
			retry.Reset(250 * time.Millisecond)
		}
	}
}

// publish writes member id's record, or deletes it when the member has left.
func (c *Cluster) publish(id string) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	key := c.cfg.EdgeID + "." + id
	m := c.edge.Registry().Lookup(id)
	if m == nil || m.Edge != "" {
		err := c.members.Delete(ctx, key)
		if err != nil && c.recoverBuckets(err) {
			err = nil // the bucket created again holds no record to delete
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = nil
		}
		return err
	}
	b, err := json.Marshal(c.recordOf(m))
	if err != nil {
		return err
	}
	_, err = c.members.Put(ctx, key, b)
	if err != nil && c.recoverBuckets(err) {
		_, err = c.members.Put(ctx, key, b) // into the bucket just created again
	}
	return err
}

func (c *Cluster) recordOf(m *group.Member) memberRecord {
	g := m.Group()
	rec := memberRecord{Edge: c.cfg.EdgeID, Tunnel: m.ID, Proto: g.Proto, Label: g.Label, Group: g.Name,
		KeyHash: g.KeyHash(), Tenant: m.Tenant, Name: m.Name, Host: m.Host, Transport: m.Transport, HealthKind: m.HealthKind, Healthy: m.Healthy(),
		Draining: m.Draining(), Weight: m.Weight, Priority: m.Priority, SlowStart: m.SlowStart,
		Affinity: g.Affinity, RetryIdempotent: g.RetryIdempotent, AlertWebhook: m.AlertWebhook, Started: c.started}
	if !g.Solo() {
		// The member's own keys: mid-rotation its pool's key may be another (newer) one.
		rec.KeyHash, rec.PrevKeyHashes = m.KeyHash(), m.PrevKeyHashes()
	}
	if m.Session != "" {
		if sp, ok := c.edge.Session(m.Session); ok {
			rec.Session, rec.ResumeHash = m.Session, hex.EncodeToString(sp.ResumeHash[:])
			if sp.Resumed != "" {
				rec.Resumes, rec.ResumesProof = sp.Resumed, hex.EncodeToString(sp.ResumedProof[:])
			}
		}
	}
	if g.Kind == group.KindTCP {
		rec.Port = g.Port
	}
	if t, ok := m.Value().(*proxy.Tunnel); ok {
		rec.BackendProtocol = t.BackendProtocol()
	}
	return rec
}

// ownKeys lists this edge's keys in the members bucket.
func (c *Cluster) ownKeys(ctx context.Context) ([]string, error) {
	lister, err := c.members.ListKeysFiltered(ctx, c.cfg.EdgeID+".*")
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// dropStaleOwnRecords deletes the member records a previous run of this edge id left; it
// reports whether it could (else the heartbeat tries again: a NATS just restarted may not
// answer yet).
func (c *Cluster) dropStaleOwnRecords() bool {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	keys, err := c.ownKeys(ctx)
	if err != nil {
		return false
	}
	ok := true
	for _, k := range keys {
		if c.edge.Registry().Lookup(strings.TrimPrefix(k, c.cfg.EdgeID+".")) == nil {
			if err := c.members.Delete(ctx, k); err != nil {
				ok = false
			}
		}
	}
	return ok
}

// spawn runs f in a goroutine close waits for, unless the cluster is stopping.
func (c *Cluster) spawn(f func()) bool {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	if c.stopped {
		return false
	}
	c.wg.Go(f)
	return true
}

// alertRecord is the value of a pool's key in the alerts bucket: the last alert sent, and
// when (the sending edge's clock).
type alertRecord struct {
	Event string    `json:"event"`
	At    time.Time `json:"at"`
}

// claimAlert reports whether this edge is the one to send alert event for pool: the first
// edge to record it in the alerts bucket, with compare-and-set, so that a pool falling to
// zero healthy members across all edges fires one alert. An alert of the same event as the
// last one recorded is another edge's copy of it only when that one was sent less than
// LeaseTTL ago (the edges learn a change within it): a pool removed while down, whose
// recovery no edge then reports, alerts again when it is back and falls again. When NATS
// cannot answer, the edge sends it: an alert twice is better than none.
func (c *Cluster) ClaimAlert(pool, event string) bool {
	sum := sha256.Sum256([]byte(pool))
	key := hex.EncodeToString(sum[:16])
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	for range 5 {
		now := time.Now()
		val, err := json.Marshal(alertRecord{Event: event, At: now})
		if err != nil {
			return true
		}
		e, err := c.alerts.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = c.alerts.Create(ctx, key, val)
		case err != nil:
			return ctx.Err() == nil || c.ctx.Err() == nil
		default:
			var last alertRecord
			if json.Unmarshal(e.Value(), &last) == nil && last.Event == event && now.Sub(last.At).Abs() < c.cfg.LeaseTTL {
				return false // another edge sent it
			}
			_, err = c.alerts.Update(ctx, key, val, e.Revision())
		}
		if err == nil {
			return true
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !strings.Contains(err.Error(), "wrong last sequence") {
			return c.ctx.Err() == nil
		}
	}
	return false
}

// announceDraining writes every local member's record as draining, at once (Shutdown, before
// it waits for the streams in flight): the other edges stop sending new work here and close
// their idle streams to these members, which would otherwise keep the wait going.
func (c *Cluster) AnnounceDraining() {
	if !c.connected.Load() {
		return // the others learn when the records go, or the lease lapses
	}
	ctx, cancel := context.WithTimeout(c.ctx, min(c.cfg.Timeout, time.Second))
	defer cancel()
	for _, g := range c.edge.Registry().Groups() {
		for _, m := range g.Members() {
			if m.Edge != "" {
				continue
			}
			rec := c.recordOf(m)
			rec.Draining = true
			b, err := json.Marshal(rec)
			if err != nil {
				continue
			}
			if _, err := c.members.Put(ctx, c.cfg.EdgeID+"."+m.ID, b); err != nil {
				return // NATS cannot take it now: the others learn when the records go
			}
		}
	}
}

// bucketCheckEvery is how often at most ensureBuckets asks NATS whether the buckets exist
// once it found them all: several workers may report a missing bucket at once.
const bucketCheckEvery = 250 * time.Millisecond

// bucketConfigs are the members, leases and alerts buckets, in that order, as this edge
// creates them.
//
// They are in memory storage on purpose: what they hold is true only while the edges keep
// renewing it. After a restart of NATS (all of its nodes; with Replicas > 1 a single node
// restarting loses nothing) they are gone, and every edge writes its lease and its members
// again within a heartbeat of finding them missing (ensureBuckets), so the others learn only
// live state. File storage would bring back, after a long outage, the member records of
// edges and tunnels that ended while NATS was down (member records have no TTL), which the
// other edges would take for real until they proved otherwise. The routes (natsstore.Store) are
// in file storage: route ownership must outlive a restart of NATS.
func (c *Cluster) bucketConfigs() []jetstream.KeyValueConfig {
	kv := func(suffix, what string, ttl time.Duration) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{Bucket: c.cfg.Bucket + suffix, Description: what, History: 1, TTL: ttl,
			Storage: jetstream.MemoryStorage, Replicas: c.cfg.Replicas}
	}
	return []jetstream.KeyValueConfig{
		kv("_members", "warren members: every edge's live members", 0),
		kv("_leases", "warren edge leases", c.cfg.LeaseTTL),
		kv("_alerts", "warren alerts: the last alert sent per pool", 0),
	}
}

// openKV opens the bucket of cfg, creating it when it does not exist (natsstore.OpenOrCreateKV);
// created tells whether this call created it.
func openKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, created bool, err error) {
	kv, created, err = natsstore.OpenOrCreateKV(ctx, js, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("cluster: open NATS bucket %s: %w", cfg.Bucket, err)
	}
	return kv, created, nil
}

// ensureBuckets creates again those of the members, leases and alerts buckets that do not
// exist (a NATS restart lost them), and reports whether it created any.
//
// The handles c.members, c.leases and c.alerts stay as they are: a jetstream.KeyValue names
// its bucket's stream and subjects, nothing of one incarnation of the stream, so a handle
// opened before works on the bucket created again with the same configuration.
func (c *Cluster) ensureBuckets() (bool, error) {
	c.bmu.Lock()
	defer c.bmu.Unlock()
	if time.Since(c.bucketsSeen) < bucketCheckEvery {
		return false, nil
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return false, fmt.Errorf("cluster: %w", err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	defer cancel()
	var created []string
	for _, cfg := range c.bucketConfigs() {
		_, made, err := openKV(ctx, js, cfg)
		if err != nil {
			return len(created) > 0, err // "cluster: open NATS bucket ..."
		}
		if made {
			created = append(created, cfg.Bucket)
		}
	}
	c.bucketsSeen = time.Now()
	if len(created) > 0 {
		c.log.Warn("NATS had lost the cluster's buckets (a restart of NATS loses them: they are in memory): created them again",
			zap.Strings("buckets", created))
	}
	return len(created) > 0, nil
}

// reviveBuckets creates the missing buckets again and, when it did, restarts the watches
// and writes every local member's record again (the lease follows at the next heartbeat).
// It reports whether it created any.
func (c *Cluster) reviveBuckets() bool {
	created, err := c.ensureBuckets()
	if err != nil {
		c.log.Debug("cannot check the cluster's NATS buckets", zap.Error(err))
	}
	if created {
		// NATS restarted as a whole (the buckets are in memory): its route bucket may have
		// lost writes too. The edge that creates the buckets again may be the first to know,
		// before any members watch can tell (it starts on the new bucket).
		c.routesMayBeLost(true)
		c.restartWatches() // they find the buckets new (watch)
		c.markAllDirty()
	}
	return created
}

// recoverBuckets is called with the error of an operation on one of the buckets: when it
// says the bucket does not exist, the missing buckets are created again (reviveBuckets). It
// reports whether any was.
func (c *Cluster) recoverBuckets(err error) bool {
	return isBucketMissing(err) && c.reviveBuckets()
}

// isBucketMissing reports whether err, from an operation on a key-value bucket, may mean that
// the bucket does not exist (natsstore.BucketMissing). ensureBuckets checks before it creates
// anything, so a false alarm costs a request.
func isBucketMissing(err error) bool { return natsstore.BucketMissing(err) }
