package tunnel

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// fakeEdge is a scripted edge on loopback for connector tests. It accepts connections,
// welcomes each hello, records every control frame a connection sends afterwards and hands
// it to onFrame, which answers (or does not) as the scenario needs. Everything it starts
// ends at cleanup.
type fakeEdge struct {
	ln net.Listener
	// onFrame handles one frame of fc; it runs on fc's read loop, so frames of one
	// connection are handled in order. It may be nil (frames are only recorded).
	onFrame func(fc *fakeConn, m wire.Message)
	// connected receives each connection once it has been welcomed.
	connected chan *fakeConn
	stop      chan struct{} // closed at cleanup
	wg        sync.WaitGroup

	mu    sync.Mutex
	n     int // connections accepted so far
	conns []*fakeConn
	gate  chan struct{} // see holdWelcomes
}

// fakeConn is one connector connection to a fakeEdge.
type fakeConn struct {
	n    int // 1 for the first connection
	raw  net.Conn
	mux  mux.Session
	ctrl net.Conn
	wmu  sync.Mutex // serialises control writes

	mu      sync.Mutex
	frames  []wire.Message
	changed chan struct{} // closed and replaced whenever a frame is recorded
}

// newFakeEdge starts a fake edge on a loopback port.
func newFakeEdge(t testing.TB, onFrame func(fc *fakeConn, m wire.Message)) *fakeEdge {
	fe := &fakeEdge{ln: listenLoopback(t), onFrame: onFrame, connected: make(chan *fakeConn, 16), stop: make(chan struct{})}
	fe.wg.Go(func() {
		for {
			raw, err := fe.ln.Accept()
			if err != nil {
				return
			}
			fe.mu.Lock()
			fe.n++
			fc := &fakeConn{n: fe.n, raw: raw, changed: make(chan struct{})}
			fe.conns = append(fe.conns, fc)
			fe.mu.Unlock()
			fe.wg.Go(func() { fe.serve(fc) })
		}
	})
	t.Cleanup(func() {
		close(fe.stop)
		_ = fe.ln.Close()
		fe.mu.Lock()
		for _, fc := range fe.conns {
			_ = fc.raw.Close() // ends its yamux session and so its read loop
		}
		fe.mu.Unlock()
		fe.wg.Wait()
	})
	return fe
}

// holdWelcomes makes every connection after the first wait for the returned func's call
// before it is welcomed, so that a test can act while the connector is reconnecting.
func (fe *fakeEdge) holdWelcomes() (release func()) {
	gate := make(chan struct{})
	fe.mu.Lock()
	fe.gate = gate
	fe.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// accepted is the number of connections accepted so far.
func (fe *fakeEdge) accepted() int {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.n
}

// addr is the address connectors dial.
func (fe *fakeEdge) addr() string { return fe.ln.Addr().String() }

func (fe *fakeEdge) serve(fc *fakeConn) {
	ym, err := mux.Server(fc.raw, zap.NewNop(), 10*time.Second)
	if err != nil {
		_ = fc.raw.Close()
		return
	}
	ctrl, err := ym.AcceptStream(context.Background())
	if err != nil {
		return
	}
	if _, err := wire.ReadFrame(ctrl); err != nil { // the hello
		return
	}
	fc.mux, fc.ctrl = ym, ctrl
	fe.mu.Lock()
	gate := fe.gate
	fe.mu.Unlock()
	if gate != nil && fc.n > 1 {
		select {
		case <-gate:
		case <-fe.stop:
			return
		}
	}
	if err := fc.send(&wire.Welcome{Version: wire.Version, SessionID: fmt.Sprint("fake", fc.n)}); err != nil {
		return
	}
	select {
	case fe.connected <- fc:
	case <-fe.stop:
		return
	}
	for {
		m, err := wire.ReadFrame(ctrl)
		if err != nil {
			return
		}
		fc.record(m)
		if fe.onFrame != nil {
			fe.onFrame(fc, m)
		}
	}
}

// nextConn returns the next welcomed connection, failing the test if none comes within d.
func (fe *fakeEdge) nextConn(t testing.TB, d time.Duration) *fakeConn {
	t.Helper()
	select {
	case fc := <-fe.connected:
		return fc
	case <-time.After(d):
		t.Fatalf("no connection from the connector within %s", d)
		return nil
	}
}

// dialFake connects a connector to fe with a fast reconnect backoff, and a drain timeout
// short enough that a Drain the script leaves unanswered does not hold the test; Close runs
// at cleanup.
func dialFake(t testing.TB, fe *fakeEdge, opts ...Option) *Session {
	t.Helper()
	opts = append([]Option{WithLogger(zaptest.NewLogger(t)), WithBackoff(10*time.Millisecond, 50*time.Millisecond),
		WithDrainTimeout(time.Second)}, opts...)
	s, err := Dial(ctxT(t), fe.addr(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// send writes one control frame to the connector.
func (fc *fakeConn) send(m wire.Message) error {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_ = fc.ctrl.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return wire.WriteFrame(fc.ctrl, m)
}

// registered answers r with a Registered frame for tunnel id.
func (fc *fakeConn) registered(r *wire.Register, id string) error {
	return fc.send(&wire.Registered{Req: r.Req, TunnelID: id, URL: "http://" + r.Label + "." + testDomain})
}

// drained answers a Drain as an edge does once the tunnel's streams are done.
func (fc *fakeConn) drained(d *wire.Drain) error {
	return fc.send(&wire.Deregistered{TunnelID: d.TunnelID, Reason: "drained"})
}

func (fc *fakeConn) record(m wire.Message) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.frames = append(fc.frames, m)
	close(fc.changed)
	fc.changed = make(chan struct{})
}

// count is the number of frames recorded so far that match.
func (fc *fakeConn) count(match func(wire.Message) bool) int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	n := 0
	for _, m := range fc.frames {
		if match(m) {
			n++
		}
	}
	return n
}

// waitFor waits up to d for the connector to have sent a frame that matches, and returns
// it; ok is false if none came.
func (fc *fakeConn) waitFor(d time.Duration, match func(wire.Message) bool) (m wire.Message, ok bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		fc.mu.Lock()
		for _, m := range fc.frames {
			if match(m) {
				fc.mu.Unlock()
				return m, true
			}
		}
		changed := fc.changed
		fc.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return nil, false
		}
	}
}

// openData opens a data stream for tunnel id, as the edge does for a public request, and
// returns the connector's acknowledgement byte. The stream is closed on return.
func (fc *fakeConn) openData(id string) (wire.Ack, error) {
	st, err := fc.mux.OpenStream()
	if err != nil {
		return 0, err
	}
	defer st.Close()
	b, err := wire.AppendEnvelope(nil, wire.Envelope{TunnelID: id, Proto: group.ProtoHTTP, RemoteAddr: "127.0.0.1:1"})
	if err != nil {
		return 0, err
	}
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := st.Write(b); err != nil {
		return 0, err
	}
	var ack [1]byte
	if _, err := st.Read(ack[:]); err != nil {
		return 0, err
	}
	return wire.Ack(ack[0]), nil
}

// isRegister and isDeregisterOf match control frames for waitFor and count.
func isRegister(label string) func(wire.Message) bool {
	return func(m wire.Message) bool { r, ok := m.(*wire.Register); return ok && r.Label == label }
}

func isDeregisterOf(id string) func(wire.Message) bool {
	return func(m wire.Message) bool { d, ok := m.(*wire.Deregister); return ok && d.TunnelID == id }
}

func isDrainOf(id string) func(wire.Message) bool {
	return func(m wire.Message) bool { d, ok := m.(*wire.Drain); return ok && d.TunnelID == id }
}
