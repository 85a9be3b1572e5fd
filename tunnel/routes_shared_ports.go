package tunnel

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// kindPort is the store kind of a cluster's TCP port reservations: "port/<n>" → the route
// ("tcp/<name>") in Group. Reserved, so that it never lapses on its own; it goes when its
// route's claim does.
const kindPort = "port"

// errPortTaken is a port another route reserved.
var errPortTaken = errors.New("tunnel: port reserved by another route")

// clusterPort picks the port of a new TCP pool of tk's route and reserves it for every edge;
// when another edge set the pool's port first, that one is returned.
func (s *sharedRules) clusterPort(tk *ticket, req *group.JoinRequest) (int, error) {
	b := s.b
	k := req.KeyHash.String()
	skip := map[int]bool{}
	for range 256 {
		p, ok := b.reg.FreePort(skip)
		if !ok {
			return 0, &group.Error{Err: group.ErrNoPorts, Msg: "no free TCP port on this edge"}
		}
		skip[p] = true
		if err := b.reservePort(p, tk); errors.Is(err, errPortTaken) {
			b.holdElsewhere(p) // another route's: not offered here again while it holds it
			continue
		} else if err != nil {
			return 0, fmt.Errorf("%w: cannot reserve a port: %w", ErrUnavailable, err)
		}
		var final int
		_, err := b.update(tk.key, func(cur *store.Route) (*store.Route, error) {
			final = 0
			if cur == nil || cur.Tenant != tk.tenant {
				return nil, ownedError(tk.kind, tk.label)
			}
			if q := cur.Ports[k]; q != 0 {
				final = q // another edge chose first
				return nil, errUnchanged
			}
			if cur.Ports == nil {
				cur.Ports = map[string]int{}
			}
			cur.Ports[k], final = p, p
			cur.Claimed = b.now()
			return cur, nil
		})
		if err != nil && !errors.Is(err, errUnchanged) {
			b.unreservePort(p, tk.key)
			var ge *group.Error
			if errors.As(err, &ge) {
				return 0, err
			}
			return 0, fmt.Errorf("%w: cannot record the route: %w", ErrUnavailable, err)
		}
		if final != p {
			b.unreservePort(p, tk.key)
		}
		b.holdPorts(&store.Route{Tenant: tk.tenant, Ports: map[string]int{k: final}})
		return final, nil
	}
	return 0, &group.Error{Err: group.ErrNoPorts, Msg: "no free TCP port in the cluster"}
}

// clusterSoloPort picks and reserves, for the whole cluster, the port of a new solo TCP
// tunnel, under "solo/<edge id>/<tunnel id>": no pool of another edge can take it, and the
// tunnel's copies on the other edges bind the same port.
func (s *sharedRules) clusterSoloPort(tk *ticket, req *group.JoinRequest) error {
	b := s.b
	tk.solo = "solo/" + s.edgeID + "/" + req.ID
	res := &ticket{key: tk.solo, tenant: tk.tenant}
	skip := map[int]bool{}
	for range 256 {
		p, ok := b.reg.FreePort(skip)
		if !ok {
			tk.solo = ""
			return &group.Error{Err: group.ErrNoPorts, Msg: "no TCP ports available"}
		}
		skip[p] = true
		switch err := b.reservePort(p, res); {
		case errors.Is(err, errPortTaken):
			b.holdElsewhere(p)
			continue
		case err != nil:
			tk.solo = ""
			return fmt.Errorf("%w: cannot reserve a port: %w", ErrUnavailable, err)
		}
		req.Port, tk.port = p, p
		return nil
	}
	tk.solo = ""
	return &group.Error{Err: group.ErrNoPorts, Msg: "no TCP ports available"}
}

// reclaimSoloPorts runs when this edge's NATS connection comes back, and when its lease is
// renewed after it lapsed (it was cut off from NATS): the other edges may have given the ports of its solo TCP tunnels to new
// tunnels meanwhile (sweepSoloPort, once RouteTTL passed). Each port is reserved again; a
// port another tunnel holds now is that tunnel's, and the sessions of this edge's tunnel on
// it are ended: their connectors register again and get another port, rather than one
// public port leading to two tunnels.
func (s *sharedRules) reclaimSoloPorts(reg *group.Registry, endSession func(id, why string)) {
	b := s.b
	b.mu.Lock()
	held := maps.Clone(b.soloPorts)
	b.mu.Unlock()
	for port, key := range held {
		var members []*group.Member // this edge's own solo tunnel on the port
		for _, x := range reg.Groups() {
			if x.Kind != group.KindTCP || !x.Solo() || x.Port != port {
				continue
			}
			for _, m := range x.Members() {
				if m.Edge == "" {
					members = append(members, m)
				}
			}
		}
		if len(members) == 0 {
			continue
		}
		err := b.reservePort(port, &ticket{key: key, tenant: members[0].Tenant})
		if !errors.Is(err, errPortTaken) {
			continue
		}
		b.mu.Lock()
		still := b.soloPorts[port] == key // not a tunnel that took the port since
		if still {
			delete(b.soloPorts, port)
		}
		b.mu.Unlock()
		if !still {
			continue
		}
		b.log.Error("the port of a solo TCP tunnel went to another tunnel while this edge was cut off from NATS: ending its connector's session, which registers again on another port",
			zap.Int("port", port))
		for _, m := range members {
			endSession(m.Session, "its solo TCP tunnel's port went to another tunnel while this edge was cut off from NATS")
		}
	}
}

// releaseSoloPort deletes the reservation of a solo TCP tunnel of this edge whose group
// went (its copies on other edges hold none).
func (b *routeBook) releaseSoloPort(port int) {
	b.mu.Lock()
	key, ok := b.soloPorts[port]
	delete(b.soloPorts, port)
	b.mu.Unlock()
	if ok {
		// Called under the registry's route lock (emptied): the store write waits in line.
		b.writes.later(store.Key(kindPort, strconv.Itoa(port)), func() { b.unreservePortNow(port, key) })
	}
}

// holdElsewhere keeps port p, reserved by a route of another edge, from being offered to
// this edge's new pools; the sweep gives it back once no reservation holds it
// (releaseElsewhere).
func (b *routeBook) holdElsewhere(p int) {
	b.mu.Lock()
	b.elsewhere[p] = true
	b.mu.Unlock()
	b.reg.HoldPorts(p)
}

// releaseElsewhere gives back the ports held by holdElsewhere whose reservations are gone
// (reserved lists the ports reserved now), unless a route this edge knows holds them.
func (b *routeBook) releaseElsewhere(reserved map[int]bool) {
	var free []int
	b.mu.Lock()
	for p := range b.elsewhere {
		if reserved[p] {
			continue
		}
		delete(b.elsewhere, p)
		held := false
		for _, ports := range b.ports {
			held = held || ports[p]
		}
		if !held {
			free = append(free, p)
		}
	}
	b.mu.Unlock()
	b.reg.ReleasePorts(free...)
}

// reservePort reserves port p for tk's route, or fails with errPortTaken.
func (b *routeBook) reservePort(p int, tk *ticket) error {
	_, err := b.update(store.Key(kindPort, strconv.Itoa(p)), func(cur *store.Route) (*store.Route, error) {
		if cur != nil {
			if cur.Group == tk.key {
				return nil, errUnchanged
			}
			return nil, errPortTaken
		}
		return &store.Route{Kind: kindPort, Label: strconv.Itoa(p), Tenant: tk.tenant, Group: tk.key,
			Reserved: true, Ports: map[string]int{"": p}, Claimed: b.now()}, nil
	})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return err
}

// unreservePort deletes port p's reservation if route still holds it, and reports whether
// it did.
func (b *routeBook) unreservePort(p int, route string) bool {
	var ok bool
	b.writes.now(store.Key(kindPort, strconv.Itoa(p)), func() { ok = b.unreservePortNow(p, route) })
	return ok
}

// unreservePortNow is unreservePort's store write, run in the key's turn.
func (b *routeBook) unreservePortNow(p int, route string) bool {
	_, err := b.st.Update(b.ctx, store.Key(kindPort, strconv.Itoa(p)), func(cur *store.Route) (*store.Route, error) {
		if cur == nil || cur.Group != route {
			return nil, errUnchanged
		}
		return nil, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Warn("cannot delete a port reservation", zap.Int("port", p), zap.Error(err))
	}
	return err == nil
}

// sweepSoloPort deletes the reservation r ("port/<n>") of a solo TCP tunnel that no edge has
// any more: its edge ("solo/<edge>/<tunnel id>") is gone (its lease lapsed RouteTTL ago, as
// a dead edge's routes stay their tenants' that long: an edge only cut off from NATS may
// still serve the tunnel), or is this edge and the tunnel is not one of its own (a previous
// incarnation's). Only the edge holding a solo tunnel releases its
// reservation otherwise, so without this every edge that died would keep its solo tunnels'
// ports from the cluster for ever. A reservation younger than the lease is left alone: its
// tunnel may be joining. It reports whether it deleted the reservation.
func (s *sharedRules) sweepSoloPort(r *store.Route, now time.Time) bool {
	b := s.b
	edge, _, ok := strings.Cut(strings.TrimPrefix(r.Group, "solo/"), "/")
	if !ok || !strings.HasPrefix(r.Group, "solo/") || now.Sub(r.Claimed) < s.lease {
		return false
	}
	port, err := strconv.Atoi(r.Label)
	if err != nil {
		return false
	}
	switch {
	case edge == s.edgeID:
		b.mu.Lock()
		mine := b.soloPorts[port] == r.Group
		b.mu.Unlock()
		if mine {
			return false
		}
	case !s.c.EdgeGone(edge, max(s.lease, b.ttl)):
		return false
	}
	b.log.Info("releasing the port of a solo TCP tunnel whose edge is gone", zap.Int("port", port), zap.String("edge", edge))
	return b.unreservePort(port, r.Group)
}

// dropPortKeys deletes the port reservations of a route whose claim lapsed.
func (s *sharedRules) dropPortKeys(r *store.Route) {
	b := s.b
	if r.Kind != store.KindTCP {
		return
	}
	for _, p := range r.Ports {
		b.unreservePort(p, r.Key())
	}
}
