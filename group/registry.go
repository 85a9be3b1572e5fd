// Package group keeps the edge's routing table: which groups exist, who their members are,
// which members are healthy, and which one gets the next request.
//
// A route is (http, subdomain) or (tcp, group name); http, https and tls tunnels all take
// the subdomain route, so one subdomain has one protocol. Connectors that present the same route and
// the same key hash join one Group; the Registry decides create, join or reject in one call
// under the route's lock, so two concurrent first registrations produce one group and a join
// never lands in a group that is being removed. Dispatch (Group.Pick) reads an immutable
// snapshot behind an atomic pointer and takes no lock.
//
// The package knows nothing of the wire or of HTTP: the edge stores its own handle in
// Member.Value and reacts to Events. Embedders get a read-only View: copies of the table that
// cannot change it.
package group

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/dispatch"
)

// Proto is the protocol a tunnel carries and the first half of its route. It is the one
// definition of the protocol names: the wire, the edge, the connector and the config files
// all use it.
type Proto string

// Protocols a member can speak.
const (
	// ProtoHTTP is routed by Host (subdomain) on the public HTTP and HTTPS listeners.
	ProtoHTTP Proto = "http"
	// ProtoHTTPS is routed by Host on the public HTTPS listener only.
	ProtoHTTPS Proto = "https"
	// ProtoTCP is routed by public TCP port (one port per group).
	ProtoTCP Proto = "tcp"
	// ProtoTLS (TLS passthrough) is routed by the server name (SNI) of the TLS ClientHello
	// on the public HTTPS listener, <subdomain>.<domain>, and carried as raw bytes: the
	// edge does not terminate TLS, the member's backend does. Its route is the subdomain,
	// as for http and https; it is dispatched per connection, as tcp is.
	ProtoTLS Proto = "tls"
)

// Valid reports whether p is one of the protocols above.
func (p Proto) Valid() bool {
	return p == ProtoHTTP || p == ProtoHTTPS || p == ProtoTCP || p == ProtoTLS
}

// IsHTTP reports whether p is routed by Host and proxied as HTTP (http or https).
func (p Proto) IsHTTP() bool { return p == ProtoHTTP || p == ProtoHTTPS }

// BySubdomain reports whether p's route is a subdomain (http, https and tls): such tunnels
// share one namespace of subdomains and one route kind (KindHTTP).
func (p Proto) BySubdomain() bool { return p.IsHTTP() || p == ProtoTLS }

// PerConnection reports whether p is dispatched per public connection and carried as raw
// bytes (tcp and tls): no HTTP is parsed, and the only affinity is client_ip.
func (p Proto) PerConnection() bool { return p == ProtoTCP || p == ProtoTLS }

// ValidateSubdomain returns an error saying why s cannot be an HTTP route's subdomain: it
// must be one DNS label of 1 to 63 characters from a-z, 0-9 and '-', not starting or ending
// with '-'. The edge and the config files use this one rule. The error reads "group:
// subdomain " and SubdomainProblem's words.
func ValidateSubdomain(s string) error {
	if p := SubdomainProblem(s); p != "" {
		return errors.New("group: subdomain " + p)
	}
	return nil
}

// SubdomainProblem is ValidateSubdomain's rule as words that follow the name of what is
// checked ("must not be empty", "\"Web\" must be lowercase"), for a message that names it in
// its own way; "" when s is a valid subdomain.
func SubdomainProblem(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return fmt.Sprintf("is %d characters long; at most 63 are allowed", len(s))
	case s[0] == '-' || s[len(s)-1] == '-':
		return fmt.Sprintf("%q must not start or end with \"-\"", s)
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
		case r >= 'A' && r <= 'Z':
			return fmt.Sprintf("%q must be lowercase", s)
		default:
			return fmt.Sprintf("%q may only hold a-z, 0-9 and \"-\" (found %q)", s, r)
		}
	}
	return ""
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi int }

// Config configures a Registry. The zero value is a registry with load balancing off and no
// TCP ports.
type Config struct {
	// LoadBalancing is the kill switch: when false, group fields are ignored and every
	// registration is solo.
	LoadBalancing bool
	// Ports is where TCP groups take their public port from.
	Ports PortRange
	// NewStrategy makes each new group's dispatch strategy; nil means least-streams.
	NewStrategy func() dispatch.Strategy
	// PreferLocalStreams makes dispatch favour this edge's own members over other edges' in
	// a cluster (no edge-to-edge hop), bounded: a local member is preferred while it has
	// fewer than PreferLocalStreams more active streams than a remote one, so 1 gives ties
	// to a local member and N lets the local members run at most N streams ahead. 0 (the
	// default): none, ties rotate over every member of the pool, local or remote, as on one
	// edge.
	PreferLocalStreams int
	// MaxActivePerMember caps each member's active streams (0: no cap). A member at its
	// cap is skipped by Pick, so one flooded group cannot take every stream a connector has.
	MaxActivePerMember int64
	// Ejection turns passive outlier ejection on (see Registry.ReportOutcome); nil: off.
	// Zero fields take DefaultEjection's values.
	Ejection *Ejection
	// AffinitySecret signs the members' affinity tokens (Member.AffinityToken); nil: a
	// random secret, so tokens do not outlive the registry.
	AffinitySecret []byte
	// OnCreate is called under the route's lock when a group is created, before its first
	// member joins (the edge binds the TCP listener here). An error aborts the join; an error
	// wrapping ErrPortUnavailable makes Join try the next port.
	OnCreate func(g *Group) error
	// OnRemove is called under the route's lock after the last member left, before the port
	// is returned to the range.
	OnRemove func(g *Group)
	// OnEvent is called for every membership and health change, in order per group, with no
	// registry lock held: it may read the registry (View, Group.Members, Member.History) and
	// even change it. Events of one group are delivered one at a time; a change made while
	// another goroutine is delivering that group's events is delivered by that goroutine,
	// right after the ones before it, so a Join or SetHealth can return just before its event
	// is seen. OnEvent should return quickly: it holds up the next event of its group.
	OnEvent func(Event)
}

// EventKind says what changed.
type EventKind uint8

// Event kinds.
const (
	EventJoined EventKind = iota + 1
	EventLeft
	EventHealth
	EventDraining
)

// String names the event kind.
func (k EventKind) String() string {
	switch k {
	case EventJoined:
		return "joined"
	case EventLeft:
		return "left"
	case EventHealth:
		return "health"
	case EventDraining:
		return "draining"
	}
	return "unknown"
}

// Event describes one change to a group. The counts are taken after the change. It holds
// copies: keeping or changing an Event changes nothing in the registry.
type Event struct {
	Kind EventKind
	// Group is the group as it was after the change (Members is nil).
	Group Info
	// Member is the member the change is about, after the change.
	Member MemberInfo
	// Healthy and Reason are the member's health after the change.
	Healthy bool
	Reason  string
	// Members, Healthy and Selectable count the group's members, those healthy (probe
	// passing and not ejected), and those healthy and not draining.
	MemberCount, HealthyCount, SelectableCount int
	// GroupRemoved is set on the EventLeft of the last member.
	GroupRemoved bool
	// Ejection is set on the EventHealth of an outlier ejection and of its end.
	Ejection bool
	// AlertWebhooks are the unique tenant alert URLs of the group's members, the event's
	// member included even when it just left, in join order. Empty for solo tunnels.
	AlertWebhooks []string
	At            time.Time
}

// JoinRequest is one registration.
type JoinRequest struct {
	// ID is the new member's tunnel id; required and unique.
	ID string
	// Proto is the member's protocol.
	Proto Proto
	// Label is the subdomain (http/https/tls), the group name (grouped tcp) or a display label
	// (solo tcp).
	Label string
	// Group is the pool's name; "" registers a solo tunnel.
	Group string
	// KeyHash is the SHA-256 of the group key; compared in constant time.
	KeyHash KeyHash
	// HealthKind is the probe type that will report on the member ("tcp", "http", "func");
	// "" or "none" means no probe: the member is healthy for good. With a probe the member
	// starts unhealthy and joins dispatch after its first healthy report.
	HealthKind string
	// AlertWebhook is the tenant URL to alert when the group reaches zero healthy members.
	AlertWebhook string
	// Tenant is the identity the member's connector authenticated as.
	Tenant string
	// Name and Host tell the members of a pool apart where they are shown: the name the
	// member's tunnel has in its connector and the machine that connector runs on. Display
	// only, kept as given ("" when unknown); the caller bounds them (wire.CleanDisplay).
	Name, Host string
	// Transport is how the member's connector reaches the edge ("tcp", "websocket", "quic";
	// "" when unknown, as for a member of an edge older than the transport's record). Display
	// only, kept as given; the caller bounds it.
	Transport string
	// Port is the public port a grouped TCP registration wants when it creates its pool:
	// the pool's port from before (held with HoldPorts). 0, or a port that is not
	// available, takes the next free one.
	Port int
	// Weight is the member's share of new work relative to the other members of its tier,
	// 1 to MaxWeight; 0 means 1.
	Weight int
	// Priority is the member's tier, 0 (first) to MaxPriority: only the lowest-numbered tier
	// with a selectable member takes new work.
	Priority int
	// SlowStart ramps the member's weight up from almost nothing over this long whenever it
	// turns selectable (joins healthy, passes its probe again, returns from an ejection);
	// 0 means at once. At most MaxSlowStart.
	SlowStart time.Duration
	// Affinity and RetryIdempotent are pool settings: the first member sets them and every
	// other member must declare the same (ErrProtoMismatch otherwise). Affinity is "",
	// "cookie", "client_ip" or "header:<Name>" (ParseAffinity); TCP and TLS pools take "" or
	// "client_ip".
	Affinity        string
	RetryIdempotent bool
	// PrevKeyHashes are hashes of group keys the joiner held before KeyHash (key rotation):
	// it may join a pool whose key is one of them, and the pool moves to KeyHash.
	PrevKeyHashes []KeyHash
	// Edge names the edge the member's connector is attached to when that is another edge
	// of a cluster (a remote member, reached through that edge); "" for a member of this
	// edge. See Config.PreferLocalStreams.
	Edge string
	// Session is an opaque name of the connector session registering the member (the
	// edge's session id), kept as Member.Session; "" for none.
	Session string
	// Value is the caller's payload, returned by Member.Value.
	Value any
}

const shardCount = 64

type shard struct {
	mu sync.Mutex
	_  [56]byte // keep shards' locks on separate cache lines
}

// Registry is the edge's table of groups. It is safe for concurrent use.
type Registry struct {
	cfg    Config
	seed   maphash.Seed
	shards [shardCount]shard
	// http maps subdomain → *Group and tcp maps key → *Group. Writes happen under the
	// key's shard lock; reads (the per-request Host lookup) take no lock.
	http, tcp sync.Map
	// byID maps member id → *Member for the read-only View.
	byID sync.Map
	// retired keeps, per pool name, the dispatches of the pools that are gone, so that a
	// per-name total never goes down. Removing a pool's route and adding its dispatches here
	// happen together under retiredMu, and Dispatches reads both under it: a pool is counted
	// once, either live or retired.
	retiredMu sync.Mutex
	retired   map[string]uint64
	ports     portPool
	seq       atomic.Uint64

	ejection Ejection // cfg.Ejection with defaults
	secret   []byte
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) *Registry {
	if cfg.NewStrategy == nil {
		cfg.NewStrategy = func() dispatch.Strategy { return new(dispatch.LeastStreams) }
	}
	r := &Registry{cfg: cfg, seed: maphash.MakeSeed(), secret: cfg.AffinitySecret}
	if cfg.Ejection != nil {
		r.ejection = cfg.Ejection.withDefaults()
	}
	if len(r.secret) == 0 {
		r.secret = make([]byte, 32)
		_, _ = rand.Read(r.secret) // crypto/rand.Read never fails
	}
	r.ports.init(cfg.Ports)
	return r
}

// LoadBalancing reports whether grouping is enabled.
func (r *Registry) LoadBalancing() bool { return r.cfg.LoadBalancing }

// LookupHTTP returns the group serving a subdomain (already lower-case), or nil: an http,
// https or tls (passthrough) group, which share the namespace of subdomains; the caller
// checks Group.Proto. It takes no lock and allocates nothing.
func (r *Registry) LookupHTTP(subdomain string) *Group {
	v, ok := r.http.Load(subdomain)
	if !ok {
		return nil
	}
	return v.(*Group)
}

// Groups returns every live group, once each (a TCP pool in the middle of a key rotation
// is stored under both keys), in no particular order.
func (r *Registry) Groups() []*Group {
	var out []*Group
	r.http.Range(func(_, v any) bool { out = append(out, v.(*Group)); return true })
	seen := map[*Group]bool{}
	r.tcp.Range(func(_, v any) bool {
		if g := v.(*Group); !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
		return true
	})
	return out
}

func (r *Registry) shardFor(key string) *shard {
	return &r.shards[maphash.String(r.seed, key)%shardCount]
}

// Lookup returns the live member with tunnel id id, or nil.
func (r *Registry) Lookup(id string) *Member {
	if v, ok := r.byID.Load(id); ok {
		return v.(*Member)
	}
	return nil
}

// Join creates, joins or rejects in one step under the route's lock. Rejections are *Error
// values wrapping ErrKeyMismatch, ErrInUse, ErrProtoMismatch, ErrNoPorts or ErrInvalid, whose
// messages a connector shows verbatim (e.g. "group key does not match for subdomain 'pool'").
func (r *Registry) Join(req JoinRequest) (*Member, error) {
	kind, err := joinKind(&req)
	if err != nil {
		return nil, err
	}
	if err := validatePolicy(&req); err != nil {
		return nil, err
	}
	grouped := req.Group != "" && r.cfg.LoadBalancing
	if !grouped {
		req.Group, req.KeyHash = "", KeyHash{}
	}
	if kind == KindTCP && grouped {
		req.Label = req.Group
	}

	key, lock, routes := r.routeOf(kind, &req, grouped)
	sh := r.shardFor(lock)
	sh.mu.Lock()
	unlocked := false
	defer func() {
		if !unlocked {
			sh.mu.Unlock()
		}
	}()

	var g *Group
	v, ok := routes.Load(key)
	adopt := false // a remote member's old key, stored as a route of the pool it rotated to
	if !ok && kind == KindTCP && grouped {
		v, ok = rotatingTCP(routes, req)
		if !ok {
			if rg, found := rotatedFromTCP(routes, req); found {
				v, ok, adopt = rg, true, true
			}
		}
	}
	if ok {
		g = v.(*Group)
		if err := admit(g, req, grouped); err != nil {
			return nil, err
		}
	} else {
		if g, err = r.create(kind, lock, req, grouped); err != nil {
			return nil, err
		}
		g.routeKeys = []string{key}
		routes.Store(key, g)
	}

	m := &Member{
		ID:           req.ID,
		Tenant:       req.Tenant,
		Name:         req.Name,
		Host:         req.Host,
		Transport:    req.Transport,
		HealthKind:   req.HealthKind,
		AlertWebhook: req.AlertWebhook,
		Edge:         req.Edge,
		Weight:       req.Weight,
		Priority:     req.Priority,
		SlowStart:    req.SlowStart,
		value:        req.Value,
		Joined:       time.Now(),
		group:        g,
		drained:      make(chan struct{}),
		limit:        uint64(max(r.cfg.MaxActivePerMember, 0)),
		Session:      req.Session,
		key:          req.KeyHash,
		prev:         slices.Clone(req.PrevKeyHashes),
		hash:         dispatch.HashString(req.ID),
		token:        r.affinityToken(req.ID),
	}
	reason := "registered"
	if req.HealthKind == "" || req.HealthKind == "none" {
		m.HealthKind = "none"
		m.healthy.Store(true)
		m.startRamp()
	} else {
		reason = "registered; waiting for the first health probe"
	}

	g.mu.Lock()
	g.members = append(g.members, m)
	if grouped {
		rotate(g, req, routes)
	}
	if adopt {
		routes.Store(key, g)
		if !slices.Contains(g.routeKeys, key) {
			g.routeKeys = append(g.routeKeys, key)
		}
	}
	m.record(Transition{At: m.Joined, Healthy: m.Healthy(), Reason: reason})
	g.publishLocked()
	r.byID.Store(m.ID, m)
	r.queueLocked(EventJoined, g, m, reason, false)
	g.mu.Unlock()
	sh.mu.Unlock()
	unlocked = true
	r.deliver(g)
	return m, nil
}

// joinKind returns the kind of route req joins, or why it cannot join any: no tunnel id, an
// unknown protocol, or no subdomain for one routed by subdomain.
func joinKind(req *JoinRequest) (Kind, error) {
	if req.ID == "" {
		return 0, reject(ErrInvalid, "tunnel id is empty")
	}
	switch req.Proto {
	case ProtoHTTP, ProtoHTTPS, ProtoTLS:
		if req.Label == "" {
			return 0, reject(ErrInvalid, "subdomain is empty")
		}
		return KindHTTP, nil
	case ProtoTCP:
		return KindTCP, nil
	}
	return 0, reject(ErrInvalid, fmt.Sprintf("unknown protocol %q", req.Proto))
}

// routeOf returns where the group req joins is stored, its key in routes, and the name of
// the route's lock (Registry.shardFor). A subdomain is its own key and lock; a TCP pool is
// keyed by its name and key hash and locked by its name; a solo TCP tunnel is keyed and
// locked by its id.
func (r *Registry) routeOf(kind Kind, req *JoinRequest, grouped bool) (key, lock string, routes *sync.Map) {
	switch {
	case kind == KindHTTP:
		return req.Label, req.Label, &r.http
	case grouped:
		return tcpKey(req.Group, req.KeyHash), "\x00tcp\x00" + req.Group, &r.tcp
	}
	key = "\x00solo\x00" + req.ID
	return key, key, &r.tcp
}

// admit decides whether req may join the existing group g; the caller holds the route lock.
func admit(g *Group, req JoinRequest, grouped bool) error {
	if g.Kind == KindTCP {
		// TCP routes include the key hash, so an existing route always matches.
		return admitPolicy(g, req)
	}
	switch {
	case !grouped:
		return reject(ErrInUse, fmt.Sprintf("subdomain '%s' is already in use", req.Label))
	case g.Solo() || !g.keyAdmits(req):
		return KeyMismatch(false, req.Label)
	case g.Proto != req.Proto:
		return reject(ErrProtoMismatch, fmt.Sprintf("protocol mismatch: group '%s' on subdomain '%s' serves %s, this tunnel is %s",
			g.Name, req.Label, g.Proto, req.Proto))
	}
	return admitPolicy(g, req)
}

// admitPolicy refuses a joiner whose pool settings differ from its pool's.
func admitPolicy(g *Group, req JoinRequest) error {
	where := fmt.Sprintf("subdomain '%s'", g.Label)
	if g.Kind == KindTCP {
		where = fmt.Sprintf("TCP group '%s'", g.Name)
	}
	show := func(a string) string {
		if a == "" {
			return "none"
		}
		return a
	}
	switch {
	case g.Affinity != req.Affinity:
		return reject(ErrProtoMismatch, fmt.Sprintf("affinity mismatch: the pool on %s uses affinity %s, this tunnel declares %s",
			where, show(g.Affinity), show(req.Affinity)))
	case g.RetryIdempotent != req.RetryIdempotent:
		return reject(ErrProtoMismatch, fmt.Sprintf("retry_idempotent mismatch: the pool on %s has it %t, this tunnel declares %t",
			where, g.RetryIdempotent, req.RetryIdempotent))
	}
	return nil
}

// validatePolicy checks and normalizes the load-balancing settings of req.
func validatePolicy(req *JoinRequest) error {
	if req.Weight == 0 {
		req.Weight = 1
	}
	switch {
	case req.Weight < 1 || req.Weight > MaxWeight:
		return reject(ErrInvalid, fmt.Sprintf("weight %d is out of range (1 to %d)", req.Weight, MaxWeight))
	case req.Priority < 0 || req.Priority > MaxPriority:
		return reject(ErrInvalid, fmt.Sprintf("priority %d is out of range (0 to %d)", req.Priority, MaxPriority))
	case req.SlowStart < 0 || req.SlowStart > MaxSlowStart:
		return reject(ErrInvalid, fmt.Sprintf("slow start %s is out of range (0 to %s)", req.SlowStart, MaxSlowStart))
	}
	a, problem := parseAffinity(req.Affinity)
	if problem != "" {
		return reject(ErrInvalid, problem)
	}
	if req.Proto.PerConnection() && a != "" && a != AffinityClientIP {
		what := "a TCP pool"
		if req.Proto == ProtoTLS {
			what = "a TLS passthrough pool"
		}
		return reject(ErrInvalid, fmt.Sprintf("affinity %s is for HTTP; %s takes client_ip", a, what))
	}
	req.Affinity = a
	return nil
}

// create makes a new group for req, taking a port for TCP; the caller holds the route lock.
func (r *Registry) create(kind Kind, lock string, req JoinRequest, grouped bool) (*Group, error) {
	g := &Group{
		Kind:     kind,
		Proto:    req.Proto,
		Label:    req.Label,
		ID:       strconv.FormatUint(r.seq.Add(1), 10),
		lock:     lock,
		strategy: r.cfg.NewStrategy(),
		// Each stream counts twice, so that a remote member's handicap can be an odd number:
		// ties are then never left to the strategy (see snapshot.loadOf).
		remoteHandicap: max(2*int64(r.cfg.PreferLocalStreams)-1, 0),

		Affinity:        req.Affinity,
		RetryIdempotent: req.RetryIdempotent,
	}
	if k, ok := g.strategy.(dispatch.Keyed); ok {
		g.keyed = k
	} else {
		g.keyed = &dispatch.Rendezvous{Fallback: g.strategy}
	}
	if grouped {
		g.Name = req.Group
		g.keyHash.Store(&req.KeyHash)
	}
	g.snap.Store(emptySnapshot)
	if kind != KindTCP {
		return g, r.onCreate(g)
	}
	var unavailable []int
	defer func() { r.ports.release(unavailable...) }()
	want := req.Port
	for {
		port, ok := 0, false
		if want > 0 {
			port, ok = r.ports.takePort(want)
			want = 0 // once: an unavailable wanted port falls back to the next free one
		}
		if !ok {
			port, ok = r.ports.take()
		}
		if !ok {
			return nil, reject(ErrNoPorts, "no TCP ports available")
		}
		g.Port = port
		err := r.onCreate(g)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, ErrPortUnavailable) {
			r.ports.release(port)
			return nil, err
		}
		unavailable = append(unavailable, port)
	}
}

func (r *Registry) onCreate(g *Group) error {
	if r.cfg.OnCreate == nil {
		return nil
	}
	return r.cfg.OnCreate(g)
}

// Leave removes m from its group at once. When m was the last member the group is removed,
// OnRemove runs and the port returns to the range. Leave is idempotent.
func (r *Registry) Leave(m *Member) {
	g := m.group
	sh := r.shardFor(g.lock)
	sh.mu.Lock()
	g.mu.Lock()
	i := slices.Index(g.members, m)
	if i < 0 {
		g.mu.Unlock()
		sh.mu.Unlock()
		return
	}
	r.byID.CompareAndDelete(m.ID, m)
	g.members = slices.Delete(g.members, i, i+1)
	m.stopEjection()
	m.draining.Store(true)
	g.publishLocked()
	m.close()
	last := len(g.members) == 0
	if last {
		g.removed = true
	} else if g.Kind == KindTCP {
		pruneTCPKeys(g, &r.tcp)
	}
	r.rebalanceLocked(g) // before the event, so that its counts include a readmitted member
	r.queueLocked(EventLeft, g, m, "left", last)
	g.mu.Unlock()

	if last {
		r.retiredMu.Lock()
		routes := &r.tcp
		if g.Kind == KindHTTP {
			routes = &r.http
		}
		for _, k := range g.routeKeys {
			routes.CompareAndDelete(k, g)
		}
		if !g.Solo() {
			if r.retired == nil {
				r.retired = map[string]uint64{}
			}
			r.retired[g.Name] += g.dispatches.Load()
		}
		r.retiredMu.Unlock()
		if r.cfg.OnRemove != nil {
			r.cfg.OnRemove(g)
		}
		if g.Kind == KindTCP {
			r.ports.release(g.Port)
		}
	}
	sh.mu.Unlock()
	r.deliver(g)
}

// Drain stops selecting m for new streams. The returned channel is closed once m's active
// streams have all ended; the caller then calls Leave (or gives up waiting and calls it
// anyway). Drain is idempotent.
func (r *Registry) Drain(m *Member) <-chan struct{} {
	g := m.group
	g.mu.Lock()
	if m.draining.Load() {
		g.mu.Unlock()
		return m.drained
	}
	m.draining.Store(true)
	// Publish the snapshot without m before closing it to new streams, so that a pick that
	// fails to acquire m finds the new snapshot on its next look.
	g.publishLocked()
	m.close()
	r.rebalanceLocked(g)
	if slices.Contains(g.members, m) {
		r.queueLocked(EventDraining, g, m, "draining", false)
	}
	g.mu.Unlock()
	r.deliver(g)
	return m.drained
}

// SetHealth sets m's health bit and reports whether its health state changed. A change is
// recorded in m's history, republishes the group's snapshot and emits EventHealth. The first
// report of a probed member is a change even when it confirms the initial unhealthy bit: the
// member goes from "waiting for its first probe" to a verdict with a reason. Reports for a
// member that has left, or that has no health check, change nothing.
func (r *Registry) SetHealth(m *Member, healthy bool, reason string) bool {
	g := m.group
	g.mu.Lock()
	if m.HealthKind == "none" || (m.probed && m.healthy.Load() == healthy) || !slices.Contains(g.members, m) {
		g.mu.Unlock()
		return false
	}
	m.probed = true
	m.healthy.Store(healthy)
	if m.Healthy() {
		m.startRamp()
	}
	m.record(Transition{At: time.Now(), Healthy: m.Healthy(), Reason: reason})
	g.publishLocked()
	if !healthy {
		r.rebalanceLocked(g)
	}
	r.queueLocked(EventHealth, g, m, reason, false)
	g.mu.Unlock()
	r.deliver(g)
	return true
}

// queueLocked appends an event to g's outbox; the caller holds g.mu, which fixes the order
// of g's events. deliver hands them to OnEvent once the caller has let go of every lock.
func (r *Registry) queueLocked(kind EventKind, g *Group, m *Member, reason string, removed bool) {
	if r.cfg.OnEvent == nil {
		return
	}
	r.pushLocked(g, eventLocked(kind, g, m, reason, removed))
}

// pushLocked appends ev to g's outbox; the caller holds g.mu.
func (r *Registry) pushLocked(g *Group, ev Event) {
	g.outMu.Lock()
	g.outbox = append(g.outbox, ev)
	g.outMu.Unlock()
}

// eventLocked describes a change of g about m; the caller holds g.mu.
func eventLocked(kind EventKind, g *Group, m *Member, reason string, removed bool) Event {
	members, healthy, selectable := g.countsLocked()
	return Event{
		Kind:            kind,
		Group:           g.infoLocked(false),
		Member:          m.info(),
		Healthy:         m.Healthy(),
		Reason:          reason,
		MemberCount:     members,
		HealthyCount:    healthy,
		SelectableCount: selectable,
		GroupRemoved:    removed,
		AlertWebhooks:   alertWebhooksLocked(g, m),
		At:              time.Now(),
	}
}

// deliver hands g's queued events to OnEvent, in order, with no registry lock held. One
// goroutine delivers a group's events at a time: if another one is at it, it will also
// deliver what was just queued, so deliver returns at once (this also makes an OnEvent that
// changes the registry safe).
func (r *Registry) deliver(g *Group) {
	if r.cfg.OnEvent == nil {
		return
	}
	g.outMu.Lock()
	if g.delivering {
		g.outMu.Unlock()
		return
	}
	g.delivering = true
	for len(g.outbox) > 0 {
		batch := g.outbox
		g.outbox = nil
		g.outMu.Unlock()
		for _, ev := range batch {
			r.cfg.OnEvent(ev)
		}
		g.outMu.Lock()
	}
	g.delivering = false
	g.outMu.Unlock()
}

// alertWebhooksLocked collects the unique alert URLs of g's members and of m.
func alertWebhooksLocked(g *Group, m *Member) []string {
	if g.Solo() {
		return nil
	}
	var urls []string
	add := func(u string) {
		if u != "" && !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	for _, x := range g.members {
		add(x.AlertWebhook)
	}
	add(m.AlertWebhook)
	return urls
}

// portPool hands out TCP ports next-fit from the last one given, so that a port just
// returned is not reused at once (late packets for the old pool go nowhere). A held port
// (kept for a route's owner) is never handed out by take, only asked for by number.
type portPool struct {
	mu     sync.Mutex
	lo     int
	inUse  []bool
	held   []bool
	cursor int
}

func (p *portPool) init(r PortRange) {
	if r.Lo <= 0 || r.Hi < r.Lo {
		return
	}
	p.lo = r.Lo
	p.inUse = make([]bool, r.Hi-r.Lo+1)
	p.held = make([]bool, r.Hi-r.Lo+1)
}

// takePort takes one given port if it is in the range and not in use (held or not).
func (p *portPool) takePort(port int) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := port - p.lo
	if i < 0 || i >= len(p.inUse) || p.inUse[i] {
		return 0, false
	}
	p.inUse[i] = true
	return port, true
}

func (p *portPool) hold(on bool, ports ...int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, port := range ports {
		if i := port - p.lo; i >= 0 && i < len(p.held) {
			p.held[i] = on
		}
	}
}

func (p *portPool) take() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.inUse)
	for k := range n {
		i := (p.cursor + k) % n
		if !p.inUse[i] && !p.held[i] {
			p.inUse[i] = true
			p.cursor = (i + 1) % n
			return p.lo + i, true
		}
	}
	return 0, false
}

func (p *portPool) release(ports ...int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, port := range ports {
		if i := port - p.lo; i >= 0 && i < len(p.inUse) {
			p.inUse[i] = false
		}
	}
}

// FreePort returns a port of the range that no pool uses, not held and not in skip, without
// taking it (a cluster reserves it with the other edges first); false when there is none.
func (r *Registry) FreePort(skip map[int]bool) (int, bool) {
	p := &r.ports
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.inUse)
	for k := range n {
		i := (p.cursor + k) % n
		if !p.inUse[i] && !p.held[i] && !skip[p.lo+i] {
			return p.lo + i, true
		}
	}
	return 0, false
}

// HoldPorts keeps ports for routes whose owners may come back: Join never gives a held port
// to a new pool unless JoinRequest.Port asks for it by number. Ports outside the range are
// ignored.
func (r *Registry) HoldPorts(ports ...int) { r.ports.hold(true, ports...) }

// ReleasePorts undoes HoldPorts: the ports go back to the range once no pool uses them.
func (r *Registry) ReleasePorts(ports ...int) { r.ports.hold(false, ports...) }

// PortsInUse returns the number of TCP ports currently taken (for invariant checks and metrics).
func (r *Registry) PortsInUse() int {
	r.ports.mu.Lock()
	defer r.ports.mu.Unlock()
	n := 0
	for _, u := range r.ports.inUse {
		if u {
			n++
		}
	}
	return n
}
