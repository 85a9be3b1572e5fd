// Package store keeps route ownership durable: which tenant owns a route, the pool's name
// and key hash, and the public TCP ports of its pools. The edge writes a route through the
// store before it acknowledges a registration, and reads every route back when it starts,
// so that ownership and ports survive restarts.
//
// Store is the interface; Memory keeps routes in memory, for as long as the process runs.
// The implementations that keep routes elsewhere live in packages of their own, so that an
// edge links only the one it uses: boltstore keeps them in an embedded bbolt database file,
// natsstore in a NATS JetStream key-value bucket that the edges of a cluster share.
// storetest checks that an implementation behaves as Store says. Recall wraps a store that
// may lose acknowledged writes (an edge of a cluster keeps its routes through one). The
// package knows nothing of HTTP or the wire.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/warren-tunnel/warren/group"
)

// Kinds of route.
const (
	// KindHTTP routes are HTTP(S) subdomains: Label is the subdomain.
	KindHTTP = "http"
	// KindTCP routes are TCP group names: Label is the group name; Ports holds one public
	// port per pool (key hash) of that name.
	KindTCP = "tcp"
)

// Route is the durable record of one route.
type Route struct {
	// Kind is KindHTTP or KindTCP; with Label it is the route's key.
	Kind  string `json:"kind"`
	Label string `json:"label"`
	// Tenant owns the route ("" is the tenant of connector tokens that belong to none).
	Tenant string `json:"tenant"`
	// Group is the pool's display name; "" for a solo HTTP tunnel.
	Group string `json:"group,omitempty"`
	// KeyHash is the HTTP pool's key hash (zero for a solo tunnel).
	KeyHash group.KeyHash `json:"key_hash"`
	// Ports maps a TCP pool's key hash (hex) to its public port.
	Ports map[string]int `json:"ports,omitempty"`
	// Reserved marks a route a configured endpoint reserves: it never lapses.
	Reserved bool `json:"reserved,omitempty"`
	// EmptySince is when the route's last member left (or when the edge started without
	// one); zero while it has members. A claim lapses a TTL after it.
	EmptySince time.Time `json:"empty_since,omitzero"`
	// Claimed is when a registration last claimed or joined the route (set by edges in a
	// cluster, which judge by it whether a claim may still be in flight elsewhere).
	Claimed time.Time `json:"claimed,omitzero"`
	// Holder is, in a cluster, the connector session of the solo HTTP tunnel that last
	// claimed the route: two solo tunnels claiming one subdomain at once on two edges tell
	// each other apart by it. Empty for a pool.
	Holder string `json:"holder,omitempty"`
	// LiveKey is, in a cluster, the key hash of the pool that last claimed a reserved HTTP
	// endpoint that sets no key of its own (KeyHash zero).
	LiveKey group.KeyHash `json:"live_key,omitzero"`
	// HolderHash is the hex SHA-256 of the Holder session's resume token: a connector that
	// resumes that session with the token is the same connector.
	HolderHash string `json:"holder_hash,omitempty"`
}

// Key is the route's key in a store: "http/<subdomain>" or "tcp/<name>".
func (r *Route) Key() string { return Key(r.Kind, r.Label) }

// Key returns the store key of a route.
func Key(kind, label string) string { return kind + "/" + label }

// Clone returns a deep copy of r.
func (r *Route) Clone() *Route {
	if r == nil {
		return nil
	}
	c := *r
	if r.Ports != nil {
		c.Ports = make(map[string]int, len(r.Ports))
		for k, v := range r.Ports {
			c.Ports[k] = v
		}
	}
	return &c
}

// ErrClosed is returned by a store that was closed.
var ErrClosed = errors.New("store: closed")

// Store keeps routes. Implementations are safe for concurrent use, and every change they
// report done is durable (for a file store: on disk, surviving kill -9).
//
// Every call but Close takes a context: once it is done, a call that has not started fails
// with an error that errors.Is matches to ctx.Err(), and a call under way gives up as far as
// the implementation can cut it short (each says how far). An Update that gave up may still
// have written: the caller cannot tell from the error, and a retry computes again from what
// is stored.
type Store interface {
	// Update reads the route at key (nil if absent), calls fn with a copy, and writes what
	// fn returns in one atomic step: a route to store it, nil to delete the key, or an error
	// to change nothing (Update returns that error). fn may be called more than once (a
	// store that detects conflicts retries), so it must have no side effects. Update
	// returns the route now stored (nil if none).
	Update(ctx context.Context, key string, fn func(cur *Route) (*Route, error)) (*Route, error)
	// Get returns the route at key, or nil.
	Get(ctx context.Context, key string) (*Route, error)
	// List returns every route, in key order.
	List(ctx context.Context) ([]*Route, error)
	// Close releases the store; later calls return ErrClosed. Closing it again does
	// nothing and returns nil.
	Close() error
}
