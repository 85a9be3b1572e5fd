package config

import (
	"encoding/hex"
	"net/netip"

	"github.com/warren-tunnel/warren/group"
)

// validateEndpoints checks what only the file can get wrong in the [[endpoints]] entries: a
// tenant of [[auth.tenants]], a key hash in hex, CIDR prefixes. The rest (a valid route of
// the edge, a pool name, a key hash for TCP, a policy of no negative numbers, no route
// reserved twice) is the library's rule: tunnel.ServerConfig.Validate checks it, reported
// by validate under these keys (serverKey).
func (c *Server) validateEndpoints(r *reporter) {
	tenants := map[string]bool{"": true}
	for _, t := range c.Auth.Tenants {
		tenants[t.Name] = true
	}
	for i, ep := range c.Endpoints {
		key := func(k string) string { return joinKey(indexKey("endpoints", i), k) }
		if !tenants[ep.Tenant] {
			r.add(key("tenant"), ErrInvalid, "%q is not a tenant of [[auth.tenants]]", ep.Tenant)
		}
		if ep.KeySHA256 != "" {
			if b, err := hex.DecodeString(ep.KeySHA256); err != nil || len(b) != 32 {
				// Failed: the library, which sees no key hash, would call it missing.
				r.fail(key("key_sha256"), ErrInvalid, "must be the 64 hex digits of a SHA-256 (e.g. printf %%s \"$KEY\" | sha256sum)")
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
	}
}

// prefixes parses CIDR strings that validation accepted.
func prefixes(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// keyHash parses a key_sha256 that validation accepted; "" gives the zero hash.
func keyHash(s string) group.KeyHash {
	h, _ := group.ParseKeyHash(s)
	return h
}
