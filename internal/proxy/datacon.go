package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/internal/wire"
)

// Data connections (see package wire) carry a public TCP connection over a socket of its
// own instead of a yamux stream, so that the edge copies it with io.Copy between two TCP
// connections, which Linux splices without copying the bytes through user space.
//
// A connector keeps a few of them open and idle for its session while it has a TCP tunnel;
// the edge keeps them in a DataConns, one per session, shared by the session's TCP tunnels.
// An idle connection costs the edge its socket and a slot in a slice: no goroutine waits on
// it (nothing is expected from the connector until the edge writes an envelope) and no buffer
// is held. A connection that died while idle (the connector closed it, a NAT dropped it) is
// found out when it is used: writing the envelope or reading the acknowledgement fails, and
// the public connection goes to the same member over a yamux stream instead, which costs
// one round trip for that one connection only.

// DataConnsMax caps the idle data connections one session may hold on the edge. The
// connector keeps fewer than that (4: see tunnel's dataPoolSize); the margin absorbs the
// moments where both sides count a connection differently (one the connector replaced while
// the edge had not used it yet). Over the cap, the oldest idle connection is closed to make
// room: a connector cannot pin more sockets than this, and a stale connection does not keep
// a fresh one out.
const DataConnsMax = 8

// DataStats are the edge's data-connection counters.
type DataStats struct {
	// Accepted counts data connections whose preamble was good and that joined a pool;
	// Refused those closed for a malformed preamble, an unknown session or a wrong token;
	// Unwanted those of a session with no TCP tunnel (or that is ending).
	Accepted, Refused, Unwanted atomic.Uint64
	// Evicted counts idle connections closed to make room under DataConnsMax.
	Evicted atomic.Uint64
	// Used counts public TCP connections carried over a data connection; Fallback those
	// that went over a yamux stream because the member's session had no idle data
	// connection, or the one taken was dead (Dead counts those) or answered AckUseStream.
	Used, Fallback, Dead atomic.Uint64
}

// DataConns is one connector session's pool of idle data connections. The zero value is not
// usable: see NewDataConns.
type DataConns struct {
	stats *DataStats

	mu     sync.Mutex
	idle   []net.Conn // oldest first
	closed bool
}

// NewDataConns returns an empty pool that counts into stats.
func NewDataConns(stats *DataStats) *DataConns { return &DataConns{stats: stats} }

// Put adds an idle, accepted data connection to the pool and reports whether it was kept;
// a closed pool closes it instead. Over DataConnsMax the oldest idle connection is closed.
func (p *DataConns) Put(c net.Conn) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = c.Close()
		return false
	}
	var evict net.Conn
	if len(p.idle) >= DataConnsMax {
		evict = p.idle[0]
		copy(p.idle, p.idle[1:])
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
	if evict != nil {
		p.stats.Evicted.Add(1)
		_ = evict.Close()
	}
	return true
}

// take returns the most recently added idle connection (the least likely to have died), or
// nil.
func (p *DataConns) take() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	c := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	return c
}

// Idle is how many idle connections the pool holds.
func (p *DataConns) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// CloseIdle closes the idle connections (the session has no TCP tunnel left to use them);
// the pool stays usable.
func (p *DataConns) CloseIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}

// Close closes the idle connections and every one Put later. Connections in use are
// not affected: they end with their tunnel's context.
func (p *DataConns) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.CloseIdle()
}

// tunnelData is a tunnel's access to its session's data connections.
type tunnelData struct {
	pool *DataConns
	// streamsOnly is set once the connector answered AckUseStream for this tunnel.
	streamsOnly atomic.Bool
}

// SetDataConns lets the tunnel's TCP connections use the idle data connections of p, its
// session's pool. Call it before the tunnel is dispatched to; without it, or when p has no
// idle connection, the tunnel's connections go over yamux streams.
func (t *Tunnel) SetDataConns(p *DataConns) {
	if p != nil {
		t.data = &tunnelData{pool: p}
	}
}

// errNoDataConn: the tunnel has no usable data connection now; use a yamux stream.
var errNoDataConn = errors.New("proxy: no data connection")

// openData takes an idle data connection of the tunnel's session, writes the envelope and
// waits for the connector's acknowledgement, as open does on a yamux stream. It returns
// errNoDataConn when the caller should open a yamux stream to the same member instead: no
// idle connection, the one taken was dead (it failed before any acknowledgement, so nothing
// reached an application), or the connector asked for streams (AckUseStream). A refusal is
// an *openError, as on a stream: the caller may try another member; the connection, still
// idle on the connector's side, goes back to the pool.
func (t *Tunnel) openData(remoteAddr string, timeout time.Duration) (net.Conn, error) {
	d := t.data
	if d == nil || d.streamsOnly.Load() {
		return nil, errNoDataConn
	}
	c := d.pool.take()
	if c == nil {
		d.pool.stats.Fallback.Add(1)
		return nil, errNoDataConn
	}
	var buf [wire.MaxEnvelopeSize + 1]byte
	env, err := wire.AppendEnvelope(buf[:0], wire.Envelope{TunnelID: t.id, RemoteAddr: remoteAddr, Proto: t.proto})
	if err != nil {
		d.pool.Put(c)
		return nil, &openError{tunnel: t.id, err: err}
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	ack := buf[:1]
	if _, err = c.Write(env); err == nil {
		_, err = io.ReadFull(c, ack)
	}
	if err != nil {
		_ = c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// The connector took the envelope and did not answer in time: its backend is
			// slow or gone, as on a stream that timed out.
			return nil, &openError{tunnel: t.id, err: fmt.Errorf("waiting for the acknowledgement: %w", err)}
		}
		d.pool.stats.Dead.Add(1)
		d.pool.stats.Fallback.Add(1)
		return nil, errNoDataConn
	}
	switch a := wire.Ack(ack[0]); a {
	case wire.AckOK:
		_ = c.SetDeadline(time.Time{})
		QuickAck(c)
		d.pool.stats.Used.Add(1)
		return c, nil
	case wire.AckUseStream:
		d.streamsOnly.Store(true)
		_ = c.SetDeadline(time.Time{})
		d.pool.Put(c)
		d.pool.stats.Fallback.Add(1)
		return nil, errNoDataConn
	case wire.AckRefused, wire.AckUnknownTunnel:
		// The connector refused before anything reached an application and waits for the
		// next envelope on this connection.
		_ = c.SetDeadline(time.Time{})
		d.pool.Put(c)
		return nil, &openError{tunnel: t.id, err: errors.New(a.String())}
	default:
		_ = c.Close()
		return nil, &openError{tunnel: t.id, err: errors.New(a.String())}
	}
}

// UsesDataConns reports whether the tunnel's TCP connections may use data connections
// (SetDataConns was called).
func (t *Tunnel) UsesDataConns() bool { return t.data != nil }
