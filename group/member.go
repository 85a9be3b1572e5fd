package group

import (
	"sync"
	"sync/atomic"
	"time"
)

// HistoryLen is how many health transitions a member keeps.
const HistoryLen = 50

// closedBit marks a member that takes no new streams (draining or gone); the low bits of the
// state word count its active streams.
const closedBit = uint64(1) << 63

// Transition is one change of a member's health bit.
type Transition struct {
	At      time.Time `json:"at"`
	Healthy bool      `json:"healthy"`
	Reason  string    `json:"reason"`
}

// Member is one tunnel inside a group.
type Member struct {
	// ID is the tunnel id the edge assigned.
	ID string
	// Tenant is the identity the member's connector authenticated as ("" for none).
	Tenant string
	// Name and Host are the member's tunnel name and its connector's host (JoinRequest).
	Name, Host string
	// Transport is how the member's connector reaches the edge (JoinRequest).
	Transport string
	// HealthKind is the probe type reporting on the member: "tcp", "http", "func" or "none".
	HealthKind string
	// AlertWebhook is the tenant URL to alert when the group reaches zero healthy members.
	AlertWebhook string
	// Joined is when the member joined.
	Joined time.Time
	// Edge is the cluster edge the member's connector is attached to, "" when it is this
	// edge (JoinRequest.Edge).
	Edge string
	// Session is the connector session that registered the member (JoinRequest.Session).
	Session string
	// Weight is the member's declared share of new work relative to the others (1–100).
	Weight int
	// Priority is the member's tier: only the lowest-numbered tier with a selectable member
	// takes new work.
	Priority int
	// SlowStart is how long the member ramps up to its full weight after it turns
	// selectable; 0 means at once.
	SlowStart time.Duration

	group *Group
	value any
	// peerLoad is a remote member's active streams as its own edge last published them.
	peerLoad atomic.Int64
	// forwarded counts the active streams of a local member that other edges of a cluster
	// forward to it (AcquireForwarded).
	forwarded atomic.Int64
	// state packs closedBit and the active stream count so that Acquire is one CAS.
	state   atomic.Uint64
	limit   uint64      // cap on active streams; 0 = none
	healthy atomic.Bool // the probe's verdict (see Healthy for the member's health)

	key   KeyHash   // the group key the member presented
	prev  []KeyHash // the keys it held before (JoinRequest.PrevKeyHashes)
	hash  uint64    // dispatch.HashString(ID): the member's place in consistent hashing
	token string    // the opaque, signed affinity token naming the member
	// rampFrom is when the member last turned selectable (nanoseconds on the package's
	// monotonic clock) while it still ramps up; 0 when it is at its full weight.
	rampFrom atomic.Int64
	// ejected is set while passive outlier ejection keeps the member out of dispatch.
	ejected atomic.Bool
	failing atomic.Bool // failures are on record (out.run or out.level is not 0)
	out     outlier     // guarded by group.mu

	drainOnce sync.Once
	drained   chan struct{}
	draining  atomic.Bool

	// history and probed are guarded by group.mu.
	history []Transition
	histPos int
	probed  bool // a health report has arrived
}

// Value returns the payload the member joined with (JoinRequest.Value).
func (m *Member) Value() any { return m.value }

// Group returns the member's group.
func (m *Member) Group() *Group { return m.group }

// Healthy reports the member's health: its probe passes (or it has none) and it is not
// ejected for failing streams.
func (m *Member) Healthy() bool { return m.healthy.Load() && !m.ejected.Load() }

// Ejected reports whether passive outlier ejection keeps the member out of dispatch.
func (m *Member) Ejected() bool { return m.ejected.Load() }

// AffinityToken is an opaque token naming the member, signed with the registry's secret, for
// an affinity cookie: Group.PickToken takes it back. A client cannot make one up for a member
// it was not given.
func (m *Member) AffinityToken() string { return m.token }

// Draining reports whether the member has been asked to drain (or has left).
func (m *Member) Draining() bool { return m.draining.Load() }

// Active is the member's number of active streams.
func (m *Member) Active() int64 { return int64(m.state.Load() &^ closedBit) }

// SetPeerLoad records a remote member's active streams as its own edge published them
// (without the streams other edges forward to it): dispatch counts them on top of the
// streams this edge has open to it.
func (m *Member) SetPeerLoad(n int64) { m.peerLoad.Store(max(n, 0)) }

// OwnActive is the member's active streams without those other edges forward to it
// (AcquireForwarded): the work this edge gave it.
func (m *Member) OwnActive() int64 { return m.Active() - m.forwarded.Load() }

// load is the member's load as dispatch sees it: the streams this edge has open to it, and
// for a remote member the streams its own edge gave it. The streams another edge forwards to
// a local member count on that edge: they are its work, and it may hold them open between
// requests (its idle connections to the member), which would make the member look busy here
// when it is not.
func (m *Member) load() int64 {
	if m.Edge != "" {
		return m.Active() + m.peerLoad.Load()
	}
	return m.OwnActive()
}

// Acquire counts one more active stream on the member, unless it is draining or gone, or
// at its cap of active streams. Every successful Acquire must be matched by one Release.
func (m *Member) Acquire() bool {
	for {
		s := m.state.Load()
		if s&closedBit != 0 || (m.limit != 0 && s >= m.limit) {
			return false
		}
		if m.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// streams is the member's active streams as far as this edge knows: all of a local member's,
// forwarded ones included; a remote member's from this edge and from its own.
func (m *Member) streams() int64 {
	if m.Edge != "" {
		return m.Active() + m.peerLoad.Load()
	}
	return m.Active()
}

// AcquireForwarded is Acquire for a stream another edge of a cluster forwards to this local
// member: it counts against the member's cap and holds up its drain like any other, but not
// in the load this edge dispatches by (see load). End it with ReleaseForwarded.
func (m *Member) AcquireForwarded() bool {
	if !m.Acquire() {
		return false
	}
	m.forwarded.Add(1)
	return true
}

// ReleaseForwarded ends a stream counted by AcquireForwarded.
func (m *Member) ReleaseForwarded() {
	m.forwarded.Add(-1)
	m.Release()
}

// Release ends a stream counted by Acquire.
func (m *Member) Release() {
	if m.state.Add(^uint64(0)) == closedBit {
		m.markDrained()
	}
}

// Drained is closed once the member is draining (or gone) and its last active stream ended.
func (m *Member) Drained() <-chan struct{} { return m.drained }

func (m *Member) close() {
	if m.state.Or(closedBit)&^closedBit == 0 {
		m.markDrained()
	}
}

func (m *Member) markDrained() { m.drainOnce.Do(func() { close(m.drained) }) }

// History returns the member's last HistoryLen health transitions, oldest first.
func (m *Member) History() []Transition {
	m.group.mu.Lock()
	defer m.group.mu.Unlock()
	out := make([]Transition, 0, len(m.history))
	if len(m.history) < HistoryLen {
		return append(out, m.history...)
	}
	out = append(out, m.history[m.histPos:]...)
	return append(out, m.history[:m.histPos]...)
}

// record appends a transition; the caller holds group.mu.
func (m *Member) record(t Transition) {
	if len(m.history) < HistoryLen {
		m.history = append(m.history, t)
		return
	}
	m.history[m.histPos] = t
	m.histPos = (m.histPos + 1) % HistoryLen
}
