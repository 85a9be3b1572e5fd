package tunnel

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// rawControl opens a yamux session and a control stream to the edge by hand, so that a test
// can write anything on it.
func rawControl(t *testing.T, addr string) (*yamux.Session, net.Conn) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	mux, err := yamux.Client(c, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mux.Close() })
	st, err := mux.OpenStream()
	require.NoError(t, err)
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	return mux, st
}

// expectError reads frames until the edge's Error frame and returns it; the session must
// then be closed by the edge.
func expectError(t *testing.T, mux *yamux.Session, ctrl net.Conn) *wire.Error {
	t.Helper()
	for {
		m, err := wire.ReadFrame(ctrl)
		require.NoError(t, err, "the edge explains before closing")
		if e, ok := m.(*wire.Error); ok {
			select {
			case <-mux.CloseChan():
			case <-time.After(5 * time.Second):
				t.Fatal("the edge kept the session open after an error")
			}
			return e
		}
	}
}

func hello(t *testing.T, ctrl net.Conn) {
	t.Helper()
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version}))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Welcome{}, m)
}

func rawFrame(typ wire.Type, payload string) []byte {
	b := []byte{byte(typ), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func TestHostileConnectorsLeaveOthersServing(t *testing.T) {
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: 300 * time.Millisecond}})
	b := backend(t, "b")
	good := e.connect()
	_, err := good.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	stillServing := func() {
		t.Helper()
		code, body := e.get("app", "/")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "b /", body)
	}

	t.Run("garbage instead of yamux", func(t *testing.T) {
		c, err := net.Dial("tcp", e.controlAddr)
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_, err = io.ReadAll(c)
		require.False(t, isTimeout(err), "the edge closes the connection")
		stillServing()
	})
	t.Run("never says hello", func(t *testing.T) {
		mux, _ := rawControl(t, e.controlAddr)
		select {
		case <-mux.CloseChan():
		case <-time.After(5 * time.Second):
			t.Fatal("a silent connector was not cut off after the hello timeout")
		}
		stillServing()
	})
	t.Run("no control stream at all", func(t *testing.T) {
		c, err := net.Dial("tcp", e.controlAddr)
		require.NoError(t, err)
		mux, err := yamux.Client(c, mux.ClientConfig(zap.NewNop()))
		require.NoError(t, err)
		defer mux.Close()
		select {
		case <-mux.CloseChan():
		case <-time.After(5 * time.Second):
			t.Fatal("a connector that opens no stream was not cut off")
		}
	})
	t.Run("oversized frame", func(t *testing.T) {
		mux, ctrl := rawControl(t, e.controlAddr)
		_, _ = ctrl.Write([]byte{byte(wire.TypeHello), 0xff, 0xff, 0xff, 0xff})
		ef := expectError(t, mux, ctrl)
		require.Equal(t, wire.CodeProtocol, ef.Code)
		require.Contains(t, ef.Message, "frame too large")
		stillServing()
	})
	t.Run("malformed frames", func(t *testing.T) {
		for _, f := range [][]byte{
			rawFrame(wire.TypeHello, "{not json"),
			rawFrame(wire.Type(200), "{}"),
			rawFrame(wire.TypeHello, `{"version":"x"}`),
		} {
			mux, ctrl := rawControl(t, e.controlAddr)
			// The edge may answer and close before our yamux confirms the write.
			_, _ = ctrl.Write(f)
			ef := expectError(t, mux, ctrl)
			require.Equal(t, wire.CodeProtocol, ef.Code)
		}
		// A frame cut short and then silence: the hello deadline ends it.
		mux, ctrl := rawControl(t, e.controlAddr)
		_, err := ctrl.Write(rawFrame(wire.TypeHello, `{"version":1}`)[:8])
		require.NoError(t, err)
		ef := expectError(t, mux, ctrl)
		require.Equal(t, wire.CodeProtocol, ef.Code)
		stillServing()
	})
	t.Run("after hello, malformed register", func(t *testing.T) {
		mux, ctrl := rawControl(t, e.controlAddr)
		hello(t, ctrl)
		_, _ = ctrl.Write(rawFrame(wire.TypeRegister, `{"proto":"http","label":"x","group":"g","key_hash":"zz"}`))
		ef := expectError(t, mux, ctrl)
		require.Equal(t, wire.CodeProtocol, ef.Code)
		require.Contains(t, ef.Message, "key_hash")
		stillServing()
	})
	t.Run("wrong version", func(t *testing.T) {
		mux, ctrl := rawControl(t, e.controlAddr)
		_ = wire.WriteFrame(ctrl, &wire.Hello{Version: 99})
		ef := expectError(t, mux, ctrl)
		require.Equal(t, wire.CodeUnsupportedVersion, ef.Code)
		require.Contains(t, ef.Message, "99")
	})
	t.Run("frames in the wrong order", func(t *testing.T) {
		mux, ctrl := rawControl(t, e.controlAddr)
		_ = wire.WriteFrame(ctrl, &wire.Register{Req: 1, Proto: "http", Label: "x"})
		ef := expectError(t, mux, ctrl)
		require.Equal(t, "expected hello, got register", ef.Message)

		mux, ctrl = rawControl(t, e.controlAddr)
		hello(t, ctrl)
		_ = wire.WriteFrame(ctrl, &wire.Welcome{Version: 1, SessionID: "x"})
		ef = expectError(t, mux, ctrl)
		require.Equal(t, "unexpected welcome frame from a connector", ef.Message)
		stillServing()
	})
	t.Run("frames for tunnels the session does not own are ignored", func(t *testing.T) {
		victim := e.registry.LookupHTTP("app").Members()[0].ID
		mux, ctrl := rawControl(t, e.controlAddr)
		hello(t, ctrl)
		for _, m := range []wire.Message{
			&wire.Health{TunnelID: victim, Healthy: false, Reason: "spoofed"},
			&wire.Drain{TunnelID: victim},
			&wire.Deregister{TunnelID: victim},
		} {
			require.NoError(t, wire.WriteFrame(ctrl, m))
		}
		// The session is still usable: it can register a tunnel of its own.
		require.NoError(t, wire.WriteFrame(ctrl, &wire.Register{Req: 5, Proto: "http", Label: "mine"}))
		m, err := wire.ReadFrame(ctrl)
		require.NoError(t, err)
		require.IsType(t, &wire.Registered{}, m)
		_ = mux.Close()
		stillServing()
		require.True(t, e.registry.LookupHTTP("app").Members()[0].Healthy())
	})
	t.Run("connector-opened data streams are refused", func(t *testing.T) {
		mux, ctrl := rawControl(t, e.controlAddr)
		hello(t, ctrl)
		st, err := mux.OpenStream()
		if err == nil {
			_ = st.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = st.Write([]byte("hi"))
			_, err = st.Read(make([]byte, 1))
		}
		require.Error(t, err)
		require.False(t, isTimeout(err), "the stream is refused, not left hanging: %v", err)
		stillServing()
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
