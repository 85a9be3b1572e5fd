package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// startTCPGroup starts a TCP ingress whose one group, "pool", is served by c; it returns the
// group's public address.
func startTCPGroup(t *testing.T, c *connector) string {
	t.Helper()
	var addr atomic.Value
	tcp := NewTCP(Config{OpenTimeout: 2 * time.Second, ListenTCP: func(int) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			addr.Store(ln.Addr().String())
		}
		return ln, err
	}})
	t.Cleanup(tcp.Wait)
	t.Cleanup(tcp.Close)
	reg := group.NewRegistry(group.Config{LoadBalancing: true, Ports: group.PortRange{Lo: 40000, Hi: 40000},
		OnCreate: tcp.OnCreate, OnRemove: tcp.OnRemove})
	join(t, reg, "m", group.ProtoTCP, c)
	return addr.Load().(string)
}

// endless writes 16 KiB blocks to w until a write fails.
func endless(w io.Writer) {
	buf := make([]byte, 16<<10)
	for {
		if _, err := w.Write(buf); err != nil {
			return
		}
	}
}

// TestTCPCutByADeadConnectorIsAReset: a connector that dies in the middle of a download (its
// connection cut without a goodbye) resets the public connection, so the client reads an
// error and never takes the truncated data for the whole; a backend that ends its stream
// after sending everything still ends the public connection with a clean FIN.
func TestTCPCutByADeadConnectorIsAReset(t *testing.T) {
	t.Run("connector dies", func(t *testing.T) {
		c := startConnector(t, wire.AckOK, func(_ *connector, st mux.Stream, _ wire.Envelope) { endless(st) })
		conn, err := net.Dial("tcp", startTCPGroup(t, c))
		require.NoError(t, err)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(conn, make([]byte, 256<<10))
		require.NoError(t, err, "the download is under way")
		c.kill()
		n, err := io.Copy(io.Discard, conn)
		require.ErrorIs(t, err, syscall.ECONNRESET, "read %d more bytes, then a clean end instead of a reset", n)
	})
	t.Run("backend ends", func(t *testing.T) {
		const total = 1 << 20
		c := startConnector(t, wire.AckOK, func(_ *connector, st mux.Stream, _ wire.Envelope) {
			_, _ = st.Write(make([]byte, total))
		})
		conn, err := net.Dial("tcp", startTCPGroup(t, c))
		require.NoError(t, err)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(conn)
		require.NoError(t, err, "a clean end")
		require.Len(t, got, total)
	})
}

// serveDownload answers one request on st with a response in the given framing
// ("content-length", "chunked", or "close": delimited by the end of the stream). Its body is
// total bytes, or endless when total is negative (then it writes until the stream fails).
func serveDownload(framing string, total int) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		if _, err := http.ReadRequest(bufio.NewReader(st)); err != nil {
			return
		}
		bw := bufio.NewWriter(st)
		defer bw.Flush()
		switch framing {
		case "content-length":
			n := total
			if n < 0 {
				n = 1 << 30
			}
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n)
		case "chunked":
			fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		default:
			fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
		}
		var w io.Writer = bw
		if framing == "chunked" {
			cw := &chunkWriter{w: bw}
			defer cw.end()
			w = cw
		}
		if total < 0 {
			endless(w)
			return
		}
		_, _ = w.Write(make([]byte, total))
	}
}

// chunkWriter writes each Write as one HTTP/1.1 chunk; end writes the last chunk.
type chunkWriter struct{ w *bufio.Writer }

func (c *chunkWriter) Write(p []byte) (int, error) {
	fmt.Fprintf(c.w, "%x\r\n", len(p))
	c.w.Write(p)
	_, err := c.w.WriteString("\r\n")
	return len(p), err
}

func (c *chunkWriter) end() { _, _ = c.w.WriteString("0\r\n\r\n") }

// TestHTTPResponseCutByADeadConnectorAborts: a response cut because its connector died (its
// connection cut without a goodbye) aborts the public exchange in every framing: the client
// reads an error, never a clean end of the body. Responses that end normally still end
// cleanly, every byte delivered.
func TestHTTPResponseCutByADeadConnectorAborts(t *testing.T) {
	for _, framing := range []string{"content-length", "chunked", "close"} {
		t.Run(framing, func(t *testing.T) {
			for _, dies := range []bool{true, false} {
				const total = 1 << 20
				size := total
				if dies {
					size = -1
				}
				reg := group.NewRegistry(group.Config{LoadBalancing: true})
				c := startConnector(t, wire.AckOK, serveDownload(framing, size))
				join(t, reg, fmt.Sprint("m", dies), group.ProtoHTTP, c)
				srv := httptest.NewServer(NewHTTP(Config{Registry: reg, Domain: testDomain}))
				client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}

				req, err := http.NewRequest(http.MethodGet, srv.URL+"/big", nil)
				require.NoError(t, err)
				req.Host = "pool." + testDomain
				resp, err := client.Do(req)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				if dies {
					_, err = io.ReadFull(resp.Body, make([]byte, 256<<10))
					require.NoError(t, err, "the download is under way")
					c.kill()
					n, err := io.Copy(io.Discard, resp.Body)
					require.Error(t, err, "read %d more bytes, then a clean end of the body", n)
				} else {
					got, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.Len(t, got, total)
				}
				resp.Body.Close()
				client.CloseIdleConnections()
				srv.Close()
			}
		})
	}
}
