package tunnel

import (
	"crypto/sha256"
	"crypto/subtle"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/wire"
)

// sessionSet is the edge's connector sessions: what Shutdown and Close end, what a
// reconnecting connector's resume names (here or, in a cluster, on another edge), where a
// data connection finds its session.
type sessionSet struct {
	// wg is the server's: a session counts in it from add until its serve returns, so that
	// Close waits for a session served on a goroutine of the embedder's (ServeConn).
	wg *sync.WaitGroup

	// mu is a leaf: nothing else is locked, and nothing blocks, while it is held. It also
	// guards the resume fields of every session (edgeSession.resumeHash, resumed and
	// resumedProof), written before its Welcome and read by the other sessions and edges.
	mu     sync.Mutex
	closed bool // closeAll began: a session added after it would never be closed
	all    map[*edgeSession]struct{}
	byID   map[string]*edgeSession // for resuming: a reconnect ends its previous session
}

func newSessionSet(wg *sync.WaitGroup) *sessionSet {
	return &sessionSet{wg: wg, all: map[*edgeSession]struct{}{}, byID: map[string]*edgeSession{}}
}

// add puts e in the set and counts it in wg, unless closeAll began.
func (ss *sessionSet) add(e *edgeSession) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	ss.all[e] = struct{}{}
	ss.byID[e.id] = e
	ss.wg.Add(1) // the session itself; edgeSession.serve calls Done
	return true
}

// remove takes the ended session e out of the set.
func (ss *sessionSet) remove(e *edgeSession) {
	ss.mu.Lock()
	delete(ss.all, e)
	delete(ss.byID, e.id)
	ss.mu.Unlock()
}

// get returns session id, or nil if it does not live on this edge.
func (ss *sessionSet) get(id string) *edgeSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.byID[id]
}

// setResumed records that e's Hello resumes session id, with proof the SHA-256 of the resume
// token it presented.
func (ss *sessionSet) setResumed(e *edgeSession, id string, proof [32]byte) {
	ss.mu.Lock()
	e.resumed, e.resumedProof = id, proof
	ss.mu.Unlock()
}

// setResumeHash records the SHA-256 of the resume token e is welcomed with.
func (ss *sessionSet) setResumeHash(e *edgeSession, h [32]byte) {
	ss.mu.Lock()
	e.resumeHash = h
	ss.mu.Unlock()
}

// resumeHash returns session id and the SHA-256 of its resume token (zero before its
// Welcome), or nil if it does not live on this edge.
func (ss *sessionSet) resumeHash(id string) (*edgeSession, [32]byte) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e := ss.byID[id]
	if e == nil {
		return nil, [32]byte{}
	}
	return e, e.resumeHash
}

// resumeOf is what session id's members' records say of it (memberRecord): the SHA-256 of
// the resume token it was welcomed with and, when its Hello resumed a session, that
// session's id and the SHA-256 of the token presented. False when no such session lives on
// this edge.
func (ss *sessionSet) resumeOf(id string) (hash [32]byte, resumed string, proof [32]byte, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if e := ss.byID[id]; e != nil {
		return e.resumeHash, e.resumed, e.resumedProof, true
	}
	return hash, "", proof, false
}

// replace ends the session a reconnecting connector names, if the token proves it is the
// same connector, and waits (briefly) for its tunnels to be removed. The edge may not have
// noticed yet that the old connection died (a NAT dropped it, a laptop changed network):
// without this the connector's tunnels would find their own old registrations in the way.
func (ss *sessionSet) replace(id, token string, by *edgeSession) {
	old, oldHash := ss.resumeHash(id)
	if old == nil || old == by {
		return
	}
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], oldHash[:]) != 1 {
		by.log.Info("ignoring a resume with a wrong token", zap.String("old_session", id))
		return
	}
	by.log.Info("connector reconnected: ending its previous session", zap.String("old_session", id))
	// No goodbye: the other end is this same connector, which has already left that
	// connection (and a write to a dead connection could block).
	_ = old.mux.Close()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-old.endedCh:
	case <-t.C:
	}
}

// end closes connector session id, if it lives on this edge, without a goodbye: its
// connector reconnects and registers its tunnels again.
func (ss *sessionSet) end(id, why string) {
	e := ss.get(id)
	if e == nil {
		return
	}
	e.log.Warn("ending the session", zap.String("why", why))
	_ = e.mux.Close()
}

// endMoved ends session id when proof is the SHA-256 of its resume token: its connector has
// proved, on another edge of the cluster, that it held this session, and registered there
// (replace's check, made by this edge on that edge's record). The connector has left this
// session's connection, which this edge may not have noticed yet.
func (ss *sessionSet) endMoved(id, tenant string, proof [32]byte, to string) {
	old, h := ss.resumeHash(id)
	// A zero hash: not welcomed yet (its tenant is read only once the hash shows it was set).
	if old == nil || h == [32]byte{} || old.tenant != tenant || subtle.ConstantTimeCompare(h[:], proof[:]) != 1 {
		return
	}
	old.log.Info("connector moved to another edge: ending its session here", zap.String("edge", to))
	_ = old.mux.Close() // end() removes its tunnels, and their records
}

// closeAll ends every connector session, and refuses any new one from then on. With
// goodbye, each connector is first told why, in parallel, for at most goodbyeTimeout in all
// (a stalled connector cannot hold the others or the caller); then every session is closed.
func (ss *sessionSet) closeAll(reason string, goodbye bool) {
	ss.mu.Lock()
	ss.closed = true
	var sess []*edgeSession
	for e := range ss.all {
		sess = append(sess, e)
	}
	ss.mu.Unlock()
	var wg sync.WaitGroup
	if goodbye {
		bye := &sessionError{code: wire.CodeShuttingDown, msg: reason}
		said := make(chan struct{}, len(sess))
		for _, e := range sess {
			wg.Go(func() { e.goodbye(bye); said <- struct{}{} })
		}
		t := time.NewTimer(goodbyeTimeout)
	wait:
		for range sess {
			select {
			case <-said:
			case <-t.C:
				break wait
			}
		}
		t.Stop()
	}
	for _, e := range sess {
		_ = e.mux.Close() // also ends any goodbye still stuck in a write
	}
	wg.Wait()
}
