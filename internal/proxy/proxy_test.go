package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// connector is a fake connector at the far end of an in-memory yamux session.
type connector struct {
	edge    mux.Session  // the edge's side, which opens the streams
	conn    net.Conn     // the connector's end of the connection
	key     [32]byte     // the session's unread-notice key
	streams atomic.Int64 // streams received, acknowledged or not
}

// kill cuts the connector's connection without a goodbye, as a crash does: both sessions
// end, and every stream on them with its buffered bytes.
func (c *connector) kill() { _ = c.conn.Close() }

// startConnector runs a fake connector: it answers every stream's envelope with ack and,
// when that is AckOK, hands the stream to serve (which may be nil).
func startConnector(t testing.TB, ack wire.Ack, serve func(c *connector, st mux.Stream, env wire.Envelope)) *connector {
	t.Helper()
	return startConnectorOver(t, ack, serve, nil)
}

// startConnectorOver is startConnector whose connector side of the connection is wrap(conn)
// (nil: conn itself).
func startConnectorOver(t testing.TB, ack wire.Ack, serve func(c *connector, st mux.Stream, env wire.Envelope), wrap func(net.Conn) net.Conn) *connector {
	t.Helper()
	a, b := net.Pipe()
	if wrap != nil {
		b = wrap(b)
	}
	edge, err := mux.Server(a, zap.NewNop(), 2*time.Second)
	require.NoError(t, err)
	client, err := mux.Client(b, zap.NewNop())
	require.NoError(t, err)
	c := &connector{edge: edge, conn: b, key: wire.NoticeKey("resume token")}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			st, err := client.AcceptStream(context.Background())
			if err != nil {
				return
			}
			c.streams.Add(1)
			wg.Go(func() {
				defer st.Close()
				env, err := wire.ReadEnvelope(st)
				if err != nil {
					return
				}
				if _, err := st.Write([]byte{byte(ack)}); err != nil || ack != wire.AckOK || serve == nil {
					return
				}
				serve(c, st, env)
			})
		}
	})
	t.Cleanup(func() {
		_ = edge.Close()
		_ = client.Close()
		wg.Wait()
	})
	return c
}

// join registers a member of group "pool" (proto p) served by c.
func join(t *testing.T, reg *group.Registry, id string, p group.Proto, c *connector) (*group.Member, *Tunnel) {
	t.Helper()
	tun := NewTunnel(context.Background(), id, p, c.edge, &c.key)
	t.Cleanup(tun.Close)
	m, err := reg.Join(group.JoinRequest{ID: id, Proto: p, Label: "pool", Group: "pool", Value: tun})
	require.NoError(t, err)
	return m, tun
}

func newStats() Stats {
	return Stats{HTTPRequests: new(atomic.Uint64), TCPConnections: new(atomic.Uint64),
		RetriesOpenFailed: new(atomic.Uint64), RetriesResetUnread: new(atomic.Uint64)}
}

// echo copies a TCP stream back to the edge.
func echo(_ *connector, st mux.Stream, _ wire.Envelope) { _, _ = io.Copy(st, st) }

// answerHTTP answers every request on the stream with 200 and the tunnel id as the body.
func answerHTTP(_ *connector, st mux.Stream, env wire.Envelope) {
	br := bufio.NewReader(st)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if _, err := fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(env.TunnelID), env.TunnelID); err != nil {
			return
		}
	}
}

// TestTCPCarriesEachConnectionToAMember: a TCP group's port is bound when the group is
// created; each connection reaches a member whose backend accepted it (a refused open is
// retried on the other member, and counted); the port closes with the group; after Close no
// group can bind a port.
func TestTCPCarriesEachConnectionToAMember(t *testing.T) {
	var addr atomic.Value
	stats := newStats()
	tcp := NewTCP(Config{Stats: stats, OpenTimeout: 2 * time.Second, ListenTCP: func(int) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			addr.Store(ln.Addr().String())
		}
		return ln, err
	}})
	defer tcp.Wait()
	defer tcp.Close()
	reg := group.NewRegistry(group.Config{LoadBalancing: true, Ports: group.PortRange{Lo: 40000, Hi: 40000},
		OnCreate: tcp.OnCreate, OnRemove: tcp.OnRemove})

	refusing := startConnector(t, wire.AckRefused, nil)
	live := startConnector(t, wire.AckOK, echo)
	m1, _ := join(t, reg, "refusing", group.ProtoTCP, refusing)
	m2, _ := join(t, reg, "live", group.ProtoTCP, live)

	const n = 6
	for i := range n {
		c, err := net.Dial("tcp", addr.Load().(string))
		require.NoError(t, err)
		msg := fmt.Sprintf("hello %d", i)
		_, err = io.WriteString(c, msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
		require.NoError(t, c.Close())
	}
	require.Positive(t, refusing.streams.Load(), "the refusing member was picked")
	require.Equal(t, uint64(refusing.streams.Load()), stats.RetriesOpenFailed.Load(), "each refused open was retried once")
	require.Equal(t, uint64(n), stats.TCPConnections.Load())

	reg.Leave(m1)
	reg.Leave(m2)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr.Load().(string))
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 5*time.Second, 10*time.Millisecond, "the port closes with its group")

	tcp.Close()
	_, err := reg.Join(group.JoinRequest{ID: "late", Proto: group.ProtoTCP, Label: "late", Value: NewTunnel(context.Background(), "late", group.ProtoTCP, live.edge, &live.key)})
	require.ErrorIs(t, err, ErrClosed)
}

// TestHTTPDispatch: unknown hosts get 404; a refused open goes to the other member, once,
// and is counted; idle streams are reused and swept; a group with no member left is gone (404).
func TestHTTPDispatch(t *testing.T) {
	stats := newStats()
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, OpenTimeout: 2 * time.Second})

	get := func(host string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://"+host+"/", nil))
		return rec.Code, rec.Body.String()
	}
	code, _ := get("nope." + testDomain)
	require.Equal(t, http.StatusNotFound, code)

	refusing := startConnector(t, wire.AckRefused, nil)
	live := startConnector(t, wire.AckOK, answerHTTP)
	m1, _ := join(t, reg, "refusing", group.ProtoHTTP, refusing)
	m2, _ := join(t, reg, "live", group.ProtoHTTP, live)

	const n = 6
	for range n {
		code, body := get("pool." + testDomain)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, "live", body)
	}
	require.Positive(t, refusing.streams.Load(), "the refusing member was picked")
	require.Equal(t, uint64(refusing.streams.Load()), stats.RetriesOpenFailed.Load())
	require.Equal(t, int64(1), live.streams.Load(), "sequential requests reuse one stream")
	require.Equal(t, uint64(n+1), stats.HTTPRequests.Load())

	h.SweepIdle(time.Now().Add(time.Hour)) // closes the idle stream
	code, body := get("pool." + testDomain)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, int64(2), live.streams.Load(), "a swept stream is not reused")

	reg.Leave(m1)
	reg.Leave(m2)
	code, _ = get("pool." + testDomain)
	require.Equal(t, http.StatusNotFound, code)
}

// TestHTTPUnreadNotice: a member whose connector reports the request unread (a notice tagged
// with the session's key) has the bodyless request sent to the other member when
// RetryUnreadRequests is on, and answered 502 when it is off.
func TestHTTPUnreadNotice(t *testing.T) {
	for _, retry := range []bool{true, false} {
		t.Run(fmt.Sprintf("RetryUnreadRequests=%v", retry), func(t *testing.T) {
			stats := newStats()
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, RetryUnreadRequests: retry})
			var notices atomic.Int64
			resetting := startConnector(t, wire.AckOK, func(c *connector, st mux.Stream, _ wire.Envelope) {
				if _, err := http.ReadRequest(bufio.NewReader(st)); err != nil {
					return
				}
				notices.Add(1)
				_, _ = st.Write(wire.AppendUnreadNotice(nil, &c.key, st.StreamID()))
			})
			live := startConnector(t, wire.AckOK, answerHTTP)
			join(t, reg, "resetting", group.ProtoHTTP, resetting)
			join(t, reg, "live", group.ProtoHTTP, live)

			const n = 6
			failed := 0
			for range n {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil))
				if rec.Code != http.StatusOK {
					require.False(t, retry, "status %d", rec.Code)
					require.Equal(t, http.StatusBadGateway, rec.Code)
					failed++
					continue
				}
				require.Equal(t, "live", rec.Body.String())
			}
			require.Positive(t, notices.Load(), "the resetting member was picked")
			if retry {
				require.Equal(t, uint64(notices.Load()), stats.RetriesResetUnread.Load())
			} else {
				require.Equal(t, int(notices.Load()), failed)
				require.Zero(t, stats.RetriesResetUnread.Load())
			}
		})
	}
}

// TestNoMemberIs503: a group whose only member is unhealthy answers 503 and opens no stream.
func TestNoMemberIs503(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain})
	c := startConnector(t, wire.AckOK, answerHTTP)
	tun := NewTunnel(context.Background(), "sick", group.ProtoHTTP, c.edge, &c.key)
	defer tun.Close()
	_, err := reg.Join(group.JoinRequest{ID: "sick", Proto: group.ProtoHTTP, Label: "pool", HealthKind: "tcp", Value: tun})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Contains(t, rec.Body.String(), "no healthy backend")
	require.Zero(t, c.streams.Load())
}
