package group

import (
	"crypto/subtle"
	"slices"
	"sync"
)

// Key rotation: a connector presents its new group key and the keys it held before
// (JoinRequest.PrevKeyHashes). A pool admits a joiner whose key is the pool's current key,
// whose previous keys include the pool's current key (the pool then moves to the joiner's
// key), or whose key some member of the pool still holds (a connector that has not rotated
// yet, reconnecting). Once no member holds an old key, that key is refused (HTTP) or names
// another pool (TCP, where the key is part of the route).
//
// A remote member (JoinRequest.Edge set: a cluster edge joins another edge's member, which
// that edge's pool has admitted) is also admitted with a key some member of the pool rotated
// from: the edges learn members in no set order, and a member that has not rotated may
// arrive after the one that moved the pool on.

func tcpKey(name string, k KeyHash) string { return name + "\x00" + string(k[:]) }

func sameKey(a, b KeyHash) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// rotatingTCP finds the TCP pool a rotating joiner may join: one of its previous keys is
// the pool's current key. The caller holds the pool name's shard lock.
func rotatingTCP(routes *sync.Map, req JoinRequest) (any, bool) {
	for _, p := range req.PrevKeyHashes {
		if v, ok := routes.Load(tcpKey(req.Group, p)); ok && sameKey(v.(*Group).KeyHash(), p) {
			return v, true
		}
	}
	return nil, false
}

// rotatedFromTCP finds, for a remote member (req.Edge set), the TCP pool of its name that
// rotated from its key: one of whose members declared req.KeyHash a previous key (see the
// top of this file). A member whose edge serves it on another port (req.Port set and not the
// pool's) is not of that pool: its key made a pool of its own there after the rotation (see
// docs/load-balancing.md, "Rotating a group key"), which this edge must serve on that port too. The caller
// holds the pool name's shard lock.
func rotatedFromTCP(routes *sync.Map, req JoinRequest) (*Group, bool) {
	if req.Edge == "" {
		return nil, false
	}
	var found *Group
	routes.Range(func(_, v any) bool {
		g := v.(*Group)
		if g.Kind != KindTCP || g.Name != req.Group || (req.Port != 0 && req.Port != g.Port) {
			return true
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, m := range g.members {
			if slices.ContainsFunc(m.prev, func(p KeyHash) bool { return sameKey(p, req.KeyHash) }) {
				found = g
				return false
			}
		}
		return true
	})
	return found, found != nil
}

// keyAdmits reports whether req's keys let it join g; the caller holds the route's lock.
func (g *Group) keyAdmits(req JoinRequest) bool {
	cur := g.KeyHash()
	if sameKey(cur, req.KeyHash) {
		return true
	}
	for _, p := range req.PrevKeyHashes {
		if sameKey(cur, p) {
			return true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.members {
		if sameKey(m.key, req.KeyHash) {
			return true
		}
		if req.Edge != "" && slices.ContainsFunc(m.prev, func(p KeyHash) bool { return sameKey(p, req.KeyHash) }) {
			return true
		}
	}
	return false
}

// rotate moves g to req's key when req rotates from g's current key; a TCP pool is then
// also stored under its new key's route. The caller holds the route's lock and g.mu.
func rotate(g *Group, req JoinRequest, routes *sync.Map) {
	cur := g.KeyHash()
	if sameKey(cur, req.KeyHash) || !slices.ContainsFunc(req.PrevKeyHashes, func(p KeyHash) bool { return sameKey(p, cur) }) {
		return
	}
	k := req.KeyHash
	g.keyHash.Store(&k)
	if g.Kind == KindTCP {
		rk := tcpKey(g.Name, k)
		routes.Store(rk, g)
		if !slices.Contains(g.routeKeys, rk) {
			g.routeKeys = append(g.routeKeys, rk)
		}
	}
}

// pruneTCPKeys drops the routes of a TCP pool's old keys that no member holds any more. The
// caller holds the route's lock and g.mu.
func pruneTCPKeys(g *Group, routes *sync.Map) {
	cur := tcpKey(g.Name, g.KeyHash())
	g.routeKeys = slices.DeleteFunc(g.routeKeys, func(rk string) bool {
		if rk == cur || slices.ContainsFunc(g.members, func(m *Member) bool { return tcpKey(g.Name, m.key) == rk }) {
			return false
		}
		routes.CompareAndDelete(rk, g)
		return true
	})
}

// HoldsKey reports whether a member of g presented key k (during a rotation, members hold
// the pool's old and new keys).
func (g *Group) HoldsKey(k KeyHash) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.ContainsFunc(g.members, func(m *Member) bool { return sameKey(m.key, k) })
}

// KeyHash is the group key hash the member presented (JoinRequest.KeyHash; during a
// rotation it may differ from its pool's).
func (m *Member) KeyHash() KeyHash { return m.key }

// PrevKeyHashes are the key hashes the member declared it held before its key
// (JoinRequest.PrevKeyHashes). The slice is the member's own: do not modify it.
func (m *Member) PrevKeyHashes() []KeyHash { return m.prev }
