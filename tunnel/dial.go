package tunnel

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// errNoMember means the group has no healthy, non-draining member right now.
var errNoMember = errors.New("no healthy member")

// openError is a failure to open a data stream to a member before any payload was written:
// the one case where another member may be tried.
type openError struct {
	tunnel string
	err    error
}

func (e *openError) Error() string {
	return fmt.Sprintf("opening a stream to tunnel %s: %v", e.tunnel, e.err)
}
func (e *openError) Unwrap() error { return e.err }

// open opens a data stream to the tunnel's connector, writes the envelope and waits for
// the connector's acknowledgement, which it sends only once its local backend accepted the
// connection. Nothing else has been written when open fails, so the caller may retry on
// another member.
func (t *edgeTunnel) open(remoteAddr string, timeout time.Duration) (*yamux.Stream, error) {
	st, err := t.sess.mux.OpenStream()
	if err != nil {
		return nil, &openError{t.id, err}
	}
	var buf [wire.MaxEnvelopeSize + 1]byte
	env, err := wire.AppendEnvelope(buf[:0], wire.Envelope{TunnelID: t.id, RemoteAddr: remoteAddr, Proto: t.proto})
	if err != nil {
		_ = st.Close()
		return nil, &openError{t.id, err}
	}
	_ = st.SetDeadline(time.Now().Add(timeout))
	if _, err := st.Write(env); err != nil {
		_ = st.Close()
		return nil, &openError{t.id, err}
	}
	ack := buf[:1]
	if _, err := io.ReadFull(st, ack); err != nil {
		_ = st.Close()
		return nil, &openError{t.id, fmt.Errorf("waiting for the acknowledgement: %w", err)}
	}
	if a := wire.Ack(ack[0]); a != wire.AckOK {
		_ = st.Close()
		return nil, &openError{t.id, errors.New(a.String())}
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// picker chooses the members for one request or connection: a first pick and, only when
// no byte of the request can have reached an application, one other member, once.
type picker struct {
	s       *Server
	g       *group.Group
	last    *group.Member // the member picked last
	started bool
	retried bool
}

// next returns the first pick, then one member other than the last, then nil.
func (p *picker) next() *group.Member {
	switch {
	case !p.started:
		p.started = true
		p.last = p.g.Pick()
	case !p.retried && p.last != nil:
		p.retried = true
		p.last = p.g.PickExcept(p.last)
	default:
		return nil
	}
	return p.last
}

// pick picks a member and connects to it; if connecting fails (only opening the stream can
// fail here, before any payload is written) and p's retry is unspent, it tries one other
// member. The returned member holds an acquired stream slot: the caller must Release it when
// done. Called again after a success, it spends the retry on one other member.
func pick[T any](p *picker, connect func(*edgeTunnel) (T, error)) (T, *group.Member, error) {
	var zero T
	err := errNoMember
	for failed := false; ; failed = true {
		m := p.next()
		if m == nil {
			return zero, nil, err
		}
		if failed {
			p.s.retries.open.Add(1)
		}
		var v T
		if v, err = connect(m.Value.(*edgeTunnel)); err == nil {
			return v, m, nil
		}
		m.Release()
	}
}

// dialGroup opens a data stream to a member of g for a TCP connection from remoteAddr.
func (s *Server) dialGroup(g *group.Group, remoteAddr string) (*yamux.Stream, *group.Member, error) {
	return pick(&picker{s: s, g: g}, func(t *edgeTunnel) (*yamux.Stream, error) { return t.open(remoteAddr, s.cfg.OpenTimeout) })
}
