package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// TestH2CBurstAgainstALowStreamLimit: a burst of requests to one h2c member whose backend
// allows fewer streams (10) than the 100 net/http assumes before a connection's SETTINGS
// arrive. Each is served: a new connection takes one request until the backend's limit is
// known, then no more than it; no request hangs, none is refused, and the member is never
// reported failing.
func TestH2CBurstAgainstALowStreamLimit(t *testing.T) {
	for iter := range 3 {
		release := make(chan struct{})
		bs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-release
			_, _ = io.WriteString(w, "ok")
		}))
		var pr http.Protocols
		pr.SetHTTP1(true)
		pr.SetUnencryptedHTTP2(true)
		bs.Config.Protocols = &pr
		bs.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 10}
		bs.Start()
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		var failures atomic.Int64
		h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second,
			Outcome: func(m *group.Member, failed bool, why string) {
				if failed {
					failures.Add(1)
					t.Logf("member failure reported: %s", why)
				}
			}})
		c := startConnector(t, wire.AckOK, pipeTo(bs.Listener.Addr().String()))
		_, tun := joinH2C(t, reg, fmt.Sprint("h2-", iter), c)
		const n = 200
		var wg sync.WaitGroup
		var ok, done atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil).WithContext(ctx)
				h.ServeHTTP(rec, req)
				if rec.Code == http.StatusOK {
					ok.Add(1)
				}
				done.Add(1)
			})
		}
		close(start)
		time.Sleep(500 * time.Millisecond)
		close(release)
		deadline := time.Now().Add(10 * time.Second)
		for done.Load() < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		hung := n - done.Load()
		cancel()
		wg.Wait()
		tun.Close()
		bs.Close()
		require.Zero(t, hung, "iteration %d: requests hung", iter)
		require.Equal(t, int64(n), ok.Load(), "iteration %d: requests failed with a healthy backend", iter)
		require.Zero(t, failures.Load(), "iteration %d: the member was reported failing", iter)
	}
}

// TestH2CSettingsFollowsFrames: the pool reads the backend's stream limit from its SETTINGS
// frames however the bytes are split, and past the other frames.
func TestH2CSettingsFollowsFrames(t *testing.T) {
	frame := func(typ, flags byte, payload []byte) []byte {
		b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
		return append(b, payload...)
	}
	setting := func(id uint16, v uint32) []byte {
		return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, id), v)
	}
	var in []byte
	in = append(in, frame(h2FrameSettings, 0, append(setting(0x4, 1<<20), setting(h2SettingMaxStreams, 7)...))...)
	in = append(in, frame(0x8, 0, []byte{0, 0, 1, 0})...)      // WINDOW_UPDATE
	in = append(in, frame(h2FrameSettings, h2FlagAck, nil)...) // ACK
	in = append(in, frame(0x0, 0, make([]byte, 100))...)       // DATA
	in = append(in, frame(h2FrameSettings, 0, setting(h2SettingMaxStreams, 3))...)
	for _, step := range []int{1, 2, 5, 9, 10, 64} {
		var s h2Settings
		s.settled = make(chan struct{})
		s.limit.Store(-1)
		first := -1
		for b := in; len(b) > 0; {
			k := min(step, len(b))
			s.feed(b[:k])
			b = b[k:]
			if n, ok := s.maxStreams(); ok && first < 0 {
				first = n
			}
		}
		require.Equal(t, 7, first, "split every %d bytes", step)
		n, _ := s.maxStreams()
		require.Equal(t, 3, n, "split every %d bytes", step)
	}
	// A first SETTINGS without a limit: net/http's default.
	var s h2Settings
	s.settled = make(chan struct{})
	s.feed(frame(h2FrameSettings, 0, setting(0x4, 1<<20)))
	n, ok := s.maxStreams()
	require.True(t, ok)
	require.Equal(t, h2DefaultMaxStreams, n)
}

// TestNo1xxToHTTP10Clients: a backend's 103 Early Hints is not relayed to an HTTP/1.0 client
// (RFC 9110 §15.2), whose first response must be the final one; an HTTP/1.1 client gets it.
func TestNo1xxToHTTP10Clients(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "final")
	})
	for _, proto := range []string{wire.BackendHTTP1, wire.BackendH2C} {
		t.Run(proto, func(t *testing.T) {
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
			be := h2cBackend(t, handler)
			c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
			tun := NewTunnel(context.Background(), "m", group.ProtoHTTP, c.edge, &c.key)
			tun.SetBackendProtocol(proto)
			t.Cleanup(tun.Close)
			_, err := reg.Join(group.JoinRequest{ID: "m", Proto: group.ProtoHTTP, Label: "pool", Value: tun})
			require.NoError(t, err)
			s := httptest.NewServer(h)
			t.Cleanup(s.Close)
			for _, version := range []string{"1.0", "1.1"} {
				conn, err := net.Dial("tcp", s.Listener.Addr().String())
				require.NoError(t, err)
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = fmt.Fprintf(conn, "GET / HTTP/%s\r\nHost: pool.%s\r\nConnection: close\r\n\r\n", version, testDomain)
				all, _ := io.ReadAll(conn)
				conn.Close()
				if version == "1.0" {
					resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(all))), nil)
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, resp.StatusCode, "an HTTP/1.0 client's first response must be the final one")
					require.NotContains(t, string(all), " 103 ")
				} else {
					require.Contains(t, string(all), "HTTP/1.1 103 Early Hints")
					require.Contains(t, string(all), "final")
				}
			}
		})
	}
}

// endless1xx is an h2c backend, written by hand, that answers each request with 1000 103
// responses before its final 200.
func endless1xx(sent *atomic.Int64) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		preface := make([]byte, 24)
		if _, err := io.ReadFull(st, preface); err != nil {
			return
		}
		frame := func(typ, flags byte, id uint32, payload []byte) []byte {
			b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags}
			b = binary.BigEndian.AppendUint32(b, id)
			return append(b, payload...)
		}
		_, _ = st.Write(frame(0x4, 0, 0, nil))
		var hdr [9]byte
		for {
			if _, err := io.ReadFull(st, hdr[:]); err != nil {
				return
			}
			payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
			if _, err := io.ReadFull(st, payload); err != nil {
				return
			}
			id := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
			switch {
			case hdr[3] == 0x4 && hdr[4]&0x1 == 0:
				_, _ = st.Write(frame(0x4, 0x1, 0, nil))
			case hdr[3] == 0x1:
				// HPACK: literal without indexing, indexed name :status (8) = "103"
				block := []byte{0x08, 0x03, '1', '0', '3'}
				for range 1000 {
					if _, err := st.Write(frame(0x1, 0x4, id, block)); err != nil {
						return
					}
					sent.Add(1)
				}
				// final: indexed :status 200 (index 8), END_STREAM|END_HEADERS
				_, _ = st.Write(frame(0x1, 0x5, id, []byte{0x88}))
			}
		}
	}
}

// TestH2CInterimResponsesAreBounded: an h2c backend that sends 1xx responses without end
// gets at most maxInterimResponses relayed, and the request fails (502), as from an HTTP/1.1
// backend.
func TestH2CInterimResponsesAreBounded(t *testing.T) {
	var sent atomic.Int64
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, endless1xx(&sent))
	joinH2C(t, reg, "h2", c)
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	conn, err := net.Dial("tcp", s.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: pool.%s\r\nConnection: close\r\n\r\n", testDomain)
	all, _ := io.ReadAll(conn)
	n1xx := strings.Count(string(all), "HTTP/1.1 103")
	require.LessOrEqual(t, n1xx, maxInterimResponses, "interim responses from an h2c backend are unbounded")
	require.Contains(t, string(all), "HTTP/1.1 502 ")
}

// TestH2CUndeclaredTrailersReachHTTP11Clients: an h2c backend's trailers that its response
// did not announce (HTTP/2 allows it), after a body with a Content-Length, reach an HTTP/1.1
// client when the response is gRPC's or the client accepts trailers (TE: trailers): it is
// relayed chunked. Any other response keeps its Content-Length.
func TestH2CUndeclaredTrailersReachHTTP11Clients(t *testing.T) {
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.URL.Query().Get("type"))
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "hello")
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "13")
	}))
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	joinH2C(t, reg, "h2", c)
	client := edgeServer(t, h)
	for _, tc := range []struct {
		name, ctype, te string
		trailers        bool
	}{
		{"grpc", "application/grpc", "", true},
		{"grpc+proto", "application/grpc+proto", "", true},
		{"TE trailers", "text/plain", "trailers", true},
		{"plain", "text/plain", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, "http://pool."+testDomain+"/?type="+tc.ctype, nil)
			require.NoError(t, err)
			if tc.te != "" {
				req.Header.Set("TE", tc.te)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, "hello", string(b))
			if tc.trailers {
				require.Equal(t, "13", resp.Trailer.Get("Grpc-Status"), "the backend's trailer was dropped")
				require.Equal(t, int64(-1), resp.ContentLength)
			} else {
				require.Equal(t, int64(5), resp.ContentLength)
			}
		})
	}
}

// TestGoneClientOpensNoMemberStream: a request whose client already went away (an HTTP/2
// stream reset as soon as it was opened) is not dispatched: no member stream is opened, for
// either backend protocol, and no member hears of it.
func TestGoneClientOpensNoMemberStream(t *testing.T) {
	for _, proto := range []string{wire.BackendHTTP1, wire.BackendH2C} {
		t.Run(proto, func(t *testing.T) {
			be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			var reports atomic.Int64
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second,
				Outcome: func(*group.Member, bool, string) { reports.Add(1) }})
			c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
			tun := NewTunnel(context.Background(), "m", group.ProtoHTTP, c.edge, &c.key)
			tun.SetBackendProtocol(proto)
			t.Cleanup(tun.Close)
			_, err := reg.Join(group.JoinRequest{ID: "m", Proto: group.ProtoHTTP, Label: "pool", Value: tun})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for range 50 {
				req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil).WithContext(ctx)
				h.ServeHTTP(httptest.NewRecorder(), req)
			}
			require.Zero(t, c.streams.Load(), "member streams opened for requests already gone")
			require.Zero(t, reports.Load())
		})
	}
}
