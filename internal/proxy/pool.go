package proxy

import (
	"sync"
	"time"
)

// maxIdlePerMember caps a member's pool of idle keep-alive streams.
const maxIdlePerMember = 64

// connPool keeps a member's idle HTTP streams for reuse (keep-alive per member).
type connPool struct {
	mu     sync.Mutex
	idle   []*memberConn
	closed bool
}

// get returns the most recently used idle stream that is still open and has been idle for
// less than maxIdle, or nil.
func (p *connPool) get(maxIdle time.Duration) *memberConn {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if time.Since(pc.idleSince) < maxIdle && pc.alive() {
			return pc
		}
		pc.closeIdle()
	}
}

// put returns an idle stream to the pool, or closes it if the pool is full or closed.
func (p *connPool) put(pc *memberConn) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdlePerMember {
		p.mu.Unlock()
		pc.closeIdle()
		return
	}
	pc.idleSince = time.Now()
	p.idle = append(p.idle, pc)
	p.mu.Unlock()
}

// closeIdle closes the idle streams; the pool stays usable.
func (p *connPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, pc := range idle {
		pc.closeIdle()
	}
}

// close closes the idle streams and every stream put back later.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.closeIdle()
}

// sweep closes streams idle since before cutoff, and lets the others drop their receive
// buffers (they are idle: nothing is in them).
func (p *connPool) sweep(cutoff time.Time) {
	p.mu.Lock()
	var old []*memberConn
	keep := p.idle[:0]
	for _, pc := range p.idle {
		if pc.idleSince.Before(cutoff) {
			old = append(old, pc)
		} else {
			pc.st.Shrink()
			keep = append(keep, pc)
		}
	}
	for i := len(keep); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = keep
	p.mu.Unlock()
	for _, pc := range old {
		pc.closeIdle()
	}
}
