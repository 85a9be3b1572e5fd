package group

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strings"
	"time"
)

// Limits of the per-member load-balancing settings of a JoinRequest.
const (
	// MaxWeight is the largest member weight; weights run from 1 to MaxWeight.
	MaxWeight = 100
	// MaxPriority is the largest (last) priority tier.
	MaxPriority = 100
	// MaxSlowStart is the longest slow start a member may ask for.
	MaxSlowStart = time.Hour
	// weightScale is what a declared weight is multiplied by before a strategy sees it, so
	// that slow start can ramp a weight of 1 smoothly.
	weightScale = 100
)

// Affinity settings a pool can declare (JoinRequest.Affinity); a header affinity is
// AffinityHeaderPrefix followed by the header's name.
const (
	AffinityCookie       = "cookie"
	AffinityClientIP     = "client_ip"
	AffinityHeaderPrefix = "header:"
)

// ParseAffinity checks an affinity setting and returns it in canonical form: "" (none),
// "cookie", "client_ip" or "header:<Canonical-Name>".
func ParseAffinity(s string) (string, error) {
	a, problem := parseAffinity(s)
	if problem != "" {
		return "", errors.New("group: " + problem)
	}
	return a, nil
}

// parseAffinity is ParseAffinity with the problem as words that a rejection's message
// holds as they are ("affinity \"x\": want cookie, ...").
func parseAffinity(s string) (string, string) {
	switch s {
	case "", AffinityCookie, AffinityClientIP:
		return s, ""
	}
	name, ok := strings.CutPrefix(s, AffinityHeaderPrefix)
	if !ok {
		return "", fmt.Sprintf("affinity %q: want cookie, client_ip or header:<Name>", s)
	}
	if name == "" || len(name) > 128 || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
		return "", fmt.Sprintf("affinity %q: %q is not a header name", s, name)
	}
	return AffinityHeaderPrefix + textproto.CanonicalMIMEHeaderKey(name), ""
}

// isTokenChar reports whether r may appear in an HTTP header name (RFC 9110 token).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// epoch anchors the monotonic nanosecond clock of slow start.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// startRamp starts m's slow start, if it has one; called when m turns selectable.
func (m *Member) startRamp() {
	if m.SlowStart > 0 {
		m.rampFrom.Store(max(nanotime(), 1))
	}
}

// weightNow is the weight a strategy sees: the declared weight scaled by weightScale, and
// lowered in proportion while the member ramps up (at least 1).
func (m *Member) weightNow() int {
	w := m.Weight * weightScale
	if from := m.rampFrom.Load(); from != 0 {
		if el := nanotime() - from; el < int64(m.SlowStart) {
			return max(1, int(int64(w)*el/int64(m.SlowStart)))
		}
		m.rampFrom.CompareAndSwap(from, 0)
	}
	return w
}

// Ramping reports whether m is still ramping up to its full weight after turning selectable.
func (m *Member) Ramping() bool {
	if from := m.rampFrom.Load(); from != 0 {
		return nanotime()-from < int64(m.SlowStart)
	}
	return false
}

// Weight, Hash: the snapshot's side of dispatch.Candidates.
func (s *snapshot) Weight(i int) int  { return s.members[i].weightNow() }
func (s *snapshot) Hash(i int) uint64 { return s.members[i].hash }

func (e *except) Weight(i int) int  { return e.s.members[e.index(i)].weightNow() }
func (e *except) Hash(i int) uint64 { return e.s.members[e.index(i)].hash }
func (e *except) index(i int) int {
	if i >= e.skip {
		i++
	}
	return i
}

// selectable reports whether m may take new work; the caller holds g.mu or reads a
// snapshot's members.
func (m *Member) selectable() bool { return m.Healthy() && !m.Draining() }

// PickKey is Pick by an affinity key (a hash of a header value or a client address): while
// the pool does not change, one key keeps landing on one member, unless that member carries
// more than its bounded share of the load (dispatch.Rendezvous). The group's strategy picks
// by key if it implements dispatch.Keyed; otherwise rendezvous hashing does.
func (g *Group) PickKey(key uint64) *Member {
	s := g.snap.Load()
	i := g.keyed.PickKey(s, key)
	if i < 0 {
		return nil
	}
	if i >= len(s.members) {
		return g.Pick() // an embedder's Keyed out of range: pick without the key
	}
	if m := s.members[i]; m.Acquire() {
		g.dispatches.Add(1)
		return m
	}
	return g.Pick() // it filled up or left since the snapshot: take any member
}

// PickToken is Pick for a request that carries an affinity token (Member.AffinityToken):
// the member it names, if that member is selectable and below its bounded share of the
// pool's load. It returns nil otherwise: the caller picks afresh and hands out a new token.
func (g *Group) PickToken(token string) *Member {
	if token == "" {
		return nil
	}
	s := g.snap.Load()
	for i, m := range s.members {
		if m.token != token {
			continue
		}
		if overBound(s, i) || !m.Acquire() {
			return nil
		}
		g.dispatches.Add(1)
		return m
	}
	return nil
}

// overBound reports whether member i of s already carries its bounded share of the load:
// ceil(1.25 × (total+1) × its weight ÷ all weights) streams, as dispatch.Rendezvous bounds it.
func overBound(s *snapshot, i int) bool {
	var total, weights int64
	for k := range s.members {
		total += s.Load(k)
		weights += int64(s.Weight(k))
	}
	w := int64(s.Weight(i))
	limit := (5*(total+1)*w + 4*weights - 1) / (4 * weights)
	return s.Load(i) >= limit
}

// affinityToken signs a member id with the registry's secret.
func (r *Registry) affinityToken(id string) string {
	mac := hmac.New(sha256.New, r.secret)
	mac.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:18])
}

// tiers arranges the selectable members sel by priority: the snapshot of the lowest tier,
// linked to the next ones as backups. handicap is the pool's remote handicap (0: none).
func tiers(sel []*Member, handicap int64) *snapshot {
	slices.SortStableFunc(sel, func(a, b *Member) int { return a.Priority - b.Priority })
	var head, tail *snapshot
	for start := 0; start < len(sel); {
		end := start + 1
		for end < len(sel) && sel[end].Priority == sel[start].Priority {
			end++
		}
		s := &snapshot{members: sel[start:end:end]}
		if handicap > 0 && slices.ContainsFunc(s.members, func(m *Member) bool { return m.Edge != "" }) {
			s.handicap = handicap
		}
		if head == nil {
			head = s
		} else {
			tail.backup = s
		}
		tail, start = s, end
	}
	return head
}
