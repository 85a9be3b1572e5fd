package tunnel

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/wire"
)

// Proto is the protocol a tunnel carries ([group.Proto]).
type Proto = group.Proto

// Protocols a tunnel can carry.
const (
	// ProtoHTTP tunnels are reached at http://<subdomain>.<domain> (and over HTTPS when the
	// edge serves it).
	ProtoHTTP = group.ProtoHTTP
	// ProtoHTTPS tunnels are reached only over the edge's HTTPS listener; plain HTTP
	// requests are redirected.
	ProtoHTTPS = group.ProtoHTTPS
	// ProtoTCP tunnels get a public TCP port from the edge's range.
	ProtoTCP = group.ProtoTCP
	// ProtoTLS tunnels (TLS passthrough) are reached on the edge's HTTPS listener by TLS
	// connections whose ClientHello names <subdomain>.<domain>; the edge does not terminate
	// TLS but carries the connection's bytes to the local target, which holds the
	// certificate (ALPN, HTTP/2 and client certificates work end to end). Dispatched per
	// connection, like tcp; the only affinity is client_ip.
	ProtoTLS = group.ProtoTLS
)

// TunnelSpec describes one tunnel to register.
type TunnelSpec struct {
	// Proto is ProtoHTTP (the default), ProtoHTTPS, ProtoTCP or ProtoTLS.
	Proto Proto
	// Subdomain is the HTTP route: the tunnel serves <Subdomain>.<edge domain>. Required
	// for http, https and tls.
	Subdomain string
	// Name is the tunnel's own name (optional, at most 63 bytes): the edge's status page and
	// admin API show it beside the member's id, with the connector's host (WithHostname),
	// so that the members of a pool can be told apart. For a solo TCP tunnel it is also the
	// route's display label. The edge shows letters, digits, '.', '-' and '_' of it, any
	// other character as '_'.
	Name string
	// Group and GroupKey make the tunnel a member of a pool: connectors presenting the same
	// route, group and key share it. The key is hashed (SHA-256) here; only the hash is sent.
	// For TCP, the group name is the route. Both or neither.
	Group    string
	GroupKey string
	// Health, when set, probes the local target; the member starts unhealthy and receives
	// traffic only while its probe passes. Listen tunnels take a health.TypeFunc check.
	Health *health.Spec
	// AlertWebhook is a URL the edge POSTs to when this tunnel's group has no healthy member
	// left. It stays on the edge; no API returns it.
	AlertWebhook string

	// Weight is this member's share of new work relative to the other members of its tier,
	// 1 to 100; 0 means 1. Priority is its tier: only the lowest-numbered tier with a
	// healthy member takes new work (0, the default, is first). SlowStart ramps its share up
	// from almost nothing over this long whenever it turns healthy; 0 means at once.
	Weight, Priority int
	SlowStart        time.Duration
	// Affinity and RetryIdempotent are pool settings: every member of a pool must declare
	// the same, or the edge refuses it with ErrProtoMismatch. Affinity keeps a client on one
	// member: "cookie" (the edge sets a signed cookie naming the member), "client_ip", or
	// "header:<Name>"; TCP pools take only "client_ip". RetryIdempotent lets the edge send a
	// request to one other member when its member fails before answering, if the request is
	// idempotent (GET, HEAD, OPTIONS, PUT, DELETE, or any with an Idempotency-Key header)
	// and its body is at most 64 KiB.
	Affinity        string
	RetryIdempotent bool
	// PreviousGroupKeys are the group keys this connector held before GroupKey, for a key
	// rotation without dropping the pool (see docs/load-balancing.md). At most 4; hashed here like
	// GroupKey.
	PreviousGroupKeys []string
	// BackendProtocol is what the local backend of an http or https tunnel speaks: "http1"
	// (the default, also "") or "h2c", HTTP/2 over cleartext with prior knowledge, which
	// gRPC servers need. With "h2c" the edge keeps an HTTP/2 connection to this member over
	// the tunnel and sends many requests on it at once. It is this member's own setting:
	// the members of a pool need not agree.
	BackendProtocol string

	// keyHash is the hex SHA-256 of GroupKey; the session keeps only this, not the key.
	keyHash string
	// prevKeyHashes are the hashes of PreviousGroupKeys.
	prevKeyHashes []string
}

func (sp TunnelSpec) describe() string {
	switch {
	case sp.Proto == ProtoTCP && sp.Group != "":
		return "tcp group " + sp.Group
	case sp.Proto == ProtoTCP:
		return "tcp " + sp.Name
	}
	return string(sp.Proto) + " " + sp.Subdomain
}

// Validate reports the settings of sp that Forward and Listen refuse before anything is
// sent, each a *FieldError naming the field ("Weight", "Health"; joined when there are
// several), or returns nil. The edge checks the rest (a subdomain's characters, whether the
// pool's members agree) and answers Forward with a rejection.
func (sp TunnelSpec) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) { errs = append(errs, fieldErr(field, format, args...)) }
	proto := sp.Proto
	if proto == "" {
		proto = ProtoHTTP
	}
	switch proto {
	case ProtoHTTP, ProtoHTTPS, ProtoTLS:
		if sp.Subdomain == "" {
			add("Subdomain", "%w when the protocol is %q: the public host name is <subdomain>.<domain>", ErrRequired, proto)
		}
	case ProtoTCP:
	default:
		add("Proto", "%q is not a protocol; use http, https, tcp or tls", sp.Proto)
	}
	switch {
	case sp.Group != "" && sp.GroupKey == "":
		add("GroupKey", "%w with a group: the members of a pool share this key", ErrRequired)
	case sp.Group == "" && sp.GroupKey != "":
		add("Group", "%w with a group key: it names the pool", ErrRequired)
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"Subdomain", sp.Subdomain, wire.MaxLabelLen}, {"Name", sp.Name, wire.MaxLabelLen},
		{"Group", sp.Group, wire.MaxGroupLen}, {"AlertWebhook", sp.AlertWebhook, wire.MaxURLLen},
	} {
		if len(f.value) > f.max {
			add(f.name, "is %d bytes long, the limit is %d", len(f.value), f.max)
		}
	}
	errs = append(errs, sp.validateLB()...)
	switch sp.BackendProtocol {
	case "", wire.BackendHTTP1:
	case wire.BackendH2C:
		if !proto.IsHTTP() {
			kind := "TCP"
			if proto == ProtoTLS {
				kind = "TLS passthrough"
			}
			add("BackendProtocol", "%q is for http and https tunnels; a %s tunnel carries bytes", sp.BackendProtocol, kind)
		}
	default:
		add("BackendProtocol", "%q is not a backend protocol (want %s or %s)", sp.BackendProtocol, wire.BackendHTTP1, wire.BackendH2C)
	}
	if h := sp.Health; h != nil {
		spec := h.WithDefaults()
		switch err := spec.Validate(); {
		case err != nil:
			errs = append(errs, &FieldError{Field: "Health", Err: err})
		case len(spec.Path) > wire.MaxURLLen:
			add("Health.Path", "is longer than %d bytes", wire.MaxURLLen)
		case proto == ProtoTLS && spec.Type == health.TypeHTTP:
			add("Health.Type", "%q sends plain HTTP, which the TLS service of a tls tunnel cannot answer; use tcp", spec.Type)
		}
	}
	return errors.Join(errs...)
}

// validateLB checks the load-balancing settings as the edge will, so that a mistake is
// reported before anything is sent.
func (sp TunnelSpec) validateLB() []error {
	var errs []error
	add := func(field, format string, args ...any) { errs = append(errs, fieldErr(field, format, args...)) }
	if sp.Weight < 0 || sp.Weight > group.MaxWeight {
		add("Weight", "%d is out of range 1-%d (0 means 1)", sp.Weight, group.MaxWeight)
	}
	if sp.Priority < 0 || sp.Priority > group.MaxPriority {
		add("Priority", "%d is out of range 0-%d (0 is the first tier)", sp.Priority, group.MaxPriority)
	}
	if sp.SlowStart < 0 || sp.SlowStart > group.MaxSlowStart {
		add("SlowStart", "%s is out of range 0-%s", sp.SlowStart, group.MaxSlowStart)
	}
	switch {
	case len(sp.PreviousGroupKeys) > 0 && sp.Group == "":
		add("PreviousGroupKeys", "needs a group and its key: previous keys rotate a pool's key")
	case len(sp.PreviousGroupKeys) > wire.MaxPrevKeys:
		add("PreviousGroupKeys", "holds %d keys; at most %d", len(sp.PreviousGroupKeys), wire.MaxPrevKeys)
	case slices.Contains(sp.PreviousGroupKeys, ""):
		add("PreviousGroupKeys", "must not hold an empty key")
	}
	if a, err := group.ParseAffinity(sp.Affinity); err != nil {
		errs = append(errs, &FieldError{Field: "Affinity", Err: err})
	} else if sp.Proto.PerConnection() && a != "" && a != group.AffinityClientIP {
		what := "a TCP pool"
		if sp.Proto == ProtoTLS {
			what = "a TLS passthrough pool (no HTTP is seen)"
		}
		add("Affinity", "%q is for HTTP tunnels; %s takes client_ip", sp.Affinity, what)
	}
	return errs
}

func (sp *TunnelSpec) normalize(listen bool) error {
	if err := sp.Validate(); err != nil {
		return fmt.Errorf("tunnel: %w: %w", ErrInvalid, err)
	}
	if sp.Proto == "" {
		sp.Proto = ProtoHTTP
	}
	sp.Affinity, _ = group.ParseAffinity(sp.Affinity)
	switch sp.BackendProtocol {
	case wire.BackendHTTP1:
		sp.BackendProtocol = ""
	}
	if sp.GroupKey != "" {
		sp.keyHash, sp.GroupKey = group.HashKey(sp.GroupKey).String(), "" // the raw key is not kept
	}
	for _, k := range sp.PreviousGroupKeys {
		sp.prevKeyHashes = append(sp.prevKeyHashes, group.HashKey(k).String())
	}
	sp.PreviousGroupKeys = nil // the raw keys are not kept
	if h := sp.Health; h != nil {
		spec := h.WithDefaults()
		if listen && spec.Type != health.TypeFunc {
			return fmt.Errorf("tunnel: %w: a Listen tunnel has no local address to probe; use a health.TypeFunc check", ErrInvalid)
		}
		sp.Health = &spec
	}
	return nil
}

// register is the Register of the tunnel, with the session's host name.
func (sp TunnelSpec) register(req uint32, host string) *wire.Register {
	m := &wire.Register{Req: req, Proto: sp.Proto, Label: sp.Subdomain, Group: sp.Group,
		Name: wire.CleanDisplay(sp.Name, wire.MaxNameLen), Host: wire.CleanDisplay(host, wire.MaxHostLen)}
	if sp.Proto == ProtoTCP {
		m.Label = sp.Name
	}
	m.KeyHash = sp.keyHash
	m.BackendProtocol = sp.BackendProtocol
	if h := sp.Health; h != nil {
		m.Health = &wire.HealthInfo{Kind: string(h.Type), Path: h.Path, IntervalMS: h.Interval.Milliseconds(),
			TimeoutMS: h.Timeout.Milliseconds(), MaxFailed: h.MaxFailed, AlertWebhook: sp.AlertWebhook}
	} else if sp.AlertWebhook != "" {
		m.Health = &wire.HealthInfo{Kind: "none", AlertWebhook: sp.AlertWebhook}
	}
	lb := wire.LBInfo{Weight: sp.Weight, Priority: sp.Priority, SlowStartMS: sp.SlowStart.Milliseconds(),
		Affinity: sp.Affinity, RetryIdempotent: sp.RetryIdempotent, PrevKeyHashes: sp.prevKeyHashes}
	if lb.Weight != 0 || lb.Priority != 0 || lb.SlowStartMS != 0 || lb.Affinity != "" || lb.RetryIdempotent || len(lb.PrevKeyHashes) > 0 {
		m.LB = &lb
	}
	return m
}
