package tunnel

import (
	"fmt"

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
)

// TunnelSpec describes one tunnel to register.
type TunnelSpec struct {
	// Proto is ProtoHTTP (the default), ProtoHTTPS or ProtoTCP.
	Proto Proto
	// Subdomain is the HTTP route: the tunnel serves <Subdomain>.<edge domain>. Required
	// for http and https.
	Subdomain string
	// Name is a display label for a solo TCP tunnel (optional).
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

	// keyHash is the hex SHA-256 of GroupKey; the session keeps only this, not the key.
	keyHash string
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

func (sp *TunnelSpec) normalize(listen bool) error {
	if sp.Proto == "" {
		sp.Proto = ProtoHTTP
	}
	switch sp.Proto {
	case ProtoHTTP, ProtoHTTPS:
		if sp.Subdomain == "" {
			return fmt.Errorf("tunnel: %w: %s tunnels need a subdomain", ErrInvalid, sp.Proto)
		}
	case ProtoTCP:
	default:
		return fmt.Errorf("tunnel: %w: unknown proto %q (want http, https or tcp)", ErrInvalid, sp.Proto)
	}
	if (sp.Group == "") != (sp.GroupKey == "") {
		return fmt.Errorf("tunnel: %w: group and group key go together", ErrInvalid)
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"subdomain", sp.Subdomain, wire.MaxLabelLen}, {"name", sp.Name, wire.MaxLabelLen},
		{"group", sp.Group, wire.MaxGroupLen}, {"alert webhook", sp.AlertWebhook, wire.MaxURLLen},
	} {
		if len(f.value) > f.max {
			return fmt.Errorf("tunnel: %w: %s is %d bytes, the limit is %d", ErrInvalid, f.name, len(f.value), f.max)
		}
	}
	if sp.GroupKey != "" {
		sp.keyHash, sp.GroupKey = group.HashKey(sp.GroupKey).String(), "" // the raw key is not kept
	}
	if h := sp.Health; h != nil {
		spec := h.WithDefaults()
		if err := spec.Validate(); err != nil {
			return fmt.Errorf("tunnel: %w: health check: %v", ErrInvalid, err)
		}
		if len(spec.Path) > wire.MaxURLLen {
			return fmt.Errorf("tunnel: %w: health check path is longer than %d bytes", ErrInvalid, wire.MaxURLLen)
		}
		if listen && spec.Type != health.TypeFunc {
			return fmt.Errorf("tunnel: %w: a Listen tunnel has no local address to probe; use a health.TypeFunc check", ErrInvalid)
		}
		sp.Health = &spec
	}
	return nil
}

func (sp TunnelSpec) register(req uint32) *wire.Register {
	m := &wire.Register{Req: req, Proto: sp.Proto, Label: sp.Subdomain, Group: sp.Group}
	if sp.Proto == ProtoTCP {
		m.Label = sp.Name
	}
	m.KeyHash = sp.keyHash
	if h := sp.Health; h != nil {
		m.Health = &wire.HealthInfo{Kind: string(h.Type), Path: h.Path, IntervalMS: h.Interval.Milliseconds(),
			TimeoutMS: h.Timeout.Milliseconds(), MaxFailed: h.MaxFailed, AlertWebhook: sp.AlertWebhook}
	} else if sp.AlertWebhook != "" {
		m.Health = &wire.HealthInfo{Kind: "none", AlertWebhook: sp.AlertWebhook}
	}
	return m
}
