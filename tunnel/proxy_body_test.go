package tunnel

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSlowRequestBodiesGet408: the edge's body timeout and minimum body rate reach the
// public listener. A client that announces a body and sends none, or trickles it far below
// the minimum rate, gets 408 and its connection closed; the backend's request is cut
// (its handler reads an error, not the end of the body) instead of waiting for the rest.
func TestSlowRequestBodiesGet408(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     ServerConfig
		trickle bool
	}{
		{"no body within the timeout", ServerConfig{RequestBody: RequestBodyLimits{Timeout: 300 * time.Millisecond, MinRate: -1}}, false},
		{"below the minimum rate", ServerConfig{RequestBody: RequestBodyLimits{MinRate: 1000, MinRateGrace: 200 * time.Millisecond}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEdge(t, tc.cfg)
			cut := make(chan error, 1)
			app := tcpBackend(t, func(c net.Conn) { // an HTTP backend that reads one request's body
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err == nil {
					_, err = io.Copy(io.Discard, req.Body)
				}
				cut <- err
			})
			sess := e.connect()
			_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "up"}, app)
			require.NoError(t, err)

			c, err := net.Dial("tcp", e.publicAddr)
			require.NoError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(15 * time.Second))
			_, err = io.WriteString(c, "POST / HTTP/1.1\r\nHost: up."+testDomain+"\r\nContent-Length: 1000000\r\n\r\n")
			require.NoError(t, err)
			stop := make(chan struct{})
			trickled := make(chan struct{})
			go func() { // 1 byte every 20 ms: 50 bytes/s
				defer close(trickled)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for tc.trickle {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte{'x'}); err != nil {
							return
						}
					}
				}
			}()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			close(stop)
			<-trickled
			require.NoError(t, err)
			require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
			_, err = io.ReadAll(br)
			require.NoError(t, err, "the edge closes the connection")
			select {
			case err := <-cut:
				require.Error(t, err, "the backend's request body is cut, not ended")
			case <-time.After(10 * time.Second):
				t.Fatal("the backend still waits for the rest of the body")
			}
		})
	}
}
