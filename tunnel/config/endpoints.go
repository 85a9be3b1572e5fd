package config

import (
	"encoding/hex"
	"net/netip"

	"github.com/warren-tunnel/warren/group"
)

// validateEndpoints checks the [[endpoints]] entries: each names a valid route of the edge,
// a known tenant, a pool name, a key hash in hex, and a well-formed policy; no route is
// reserved twice.
func (c *Server) validateEndpoints(r *reporter) {
	tenants := map[string]bool{"": true}
	for _, t := range c.Auth.Tenants {
		tenants[t.Name] = true
	}
	seen := map[string]string{}
	for i, ep := range c.Endpoints {
		base := indexKey("endpoints", i)
		key := func(k string) string { return joinKey(base, k) }
		route := ""
		switch ep.Proto {
		case "", "http", "https", "tls":
			if err := group.ValidateSubdomain(ep.Subdomain); err != nil {
				r.add(key("subdomain"), ErrInvalid, "%v", err)
			}
			if ep.Port != 0 {
				r.add(key("port"), ErrInvalid, "a port is for TCP endpoints (proto = \"tcp\")")
			}
			route = "http/" + ep.Subdomain
		case "tcp":
			if ep.Subdomain != "" {
				r.add(key("subdomain"), ErrInvalid, "a subdomain is for HTTP endpoints; a TCP endpoint is a group and a port")
			}
			if pr := c.Limits.TCPPortRange; !pr.Contains(ep.Port) {
				r.add(key("port"), ErrInvalid, "port %d is outside limits.tcp_port_range %d-%d", ep.Port, pr.Low, pr.High)
			}
			if ep.KeySHA256 == "" {
				r.add(key("key_sha256"), ErrRequired, "required for a TCP endpoint: a TCP pool is its name and key")
			}
			route = "tcp/" + ep.Group
		default:
			r.add(key("proto"), ErrInvalid, "%q is not an endpoint protocol; use \"http\", \"https\", \"tls\" or \"tcp\"", ep.Proto)
		}
		if prev, dup := seen[route]; dup && route != "" {
			r.add(base, ErrInvalid, "reserves the same route as %s%s", prev, r.lineNote(prev))
		} else {
			seen[route] = base
		}
		if ep.Group == "" {
			r.add(key("group"), ErrRequired, "required: the pool's name")
		}
		if !tenants[ep.Tenant] {
			r.add(key("tenant"), ErrInvalid, "%q is not a tenant of [[auth.tenants]]", ep.Tenant)
		}
		if ep.KeySHA256 != "" {
			if b, err := hex.DecodeString(ep.KeySHA256); err != nil || len(b) != 32 {
				r.add(key("key_sha256"), ErrInvalid, "must be the 64 hex digits of a SHA-256 (e.g. printf %%s \"$KEY\" | sha256sum)")
			}
		}
		for _, list := range []struct {
			name  string
			cidrs []string
		}{{"allow_cidrs", ep.AllowCIDRs}, {"deny_cidrs", ep.DenyCIDRs}} {
			for j, s := range list.cidrs {
				if _, err := netip.ParsePrefix(s); err != nil {
					r.add(indexKey(key(list.name), j), ErrInvalid, "%q is not a CIDR prefix such as \"203.0.113.0/24\"", s)
				}
			}
		}
		if ep.RateLimit < 0 || ep.RateBurst < 0 || ep.MaxConcurrent < 0 {
			r.add(base, ErrInvalid, "rate_limit, rate_burst and max_concurrent must be 0 (none) or more")
		}
	}
}

// Prefixes parses CIDR strings that validation accepted.
func Prefixes(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// KeyHash parses a key_sha256 that validation accepted; "" gives the zero hash.
func KeyHash(s string) group.KeyHash {
	h, _ := group.ParseKeyHash(s)
	return h
}
