package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// downloadBackend is an HTTP server in the test process: /big streams up to 1 GiB of unknown
// length until its client goes, /small answers a few bytes.
func downloadBackend(t *testing.T) (port int) {
	t.Helper()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "small")
			return
		}
		for range 1 << 14 {
			if r.Context().Err() != nil {
				return
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// vmRSS finds the resident memory in /proc/<pid>/status.
var vmRSS = regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB$`)

// rss returns the resident memory of process pid, in bytes (VmRSS).
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	m := vmRSS.FindSubmatch(b)
	require.NotNil(t, m, "no VmRSS in /proc/%d/status", pid)
	kb, err := strconv.ParseInt(string(m[1]), 10, 64)
	require.NoError(t, err)
	return kb << 10
}

// peakRSS samples process pid's resident memory every 20 ms until stop is called (or the
// test ends), which returns the highest sample.
func peakRSS(t *testing.T, pid int) (stop func() int64) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var peak int64
	var once sync.Once
	stop = func() int64 {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
		return peak
	}
	t.Cleanup(func() { stop() })
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				if m := vmRSS.FindSubmatch(b); m != nil {
					kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
					peak = max(peak, kb<<10)
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return stop
}

// cutMetric finds warren_http_responses_cut_total's series in the edge's metrics.
var cutMetric = regexp.MustCompile(`(?m)^warren_http_responses_cut_total\{reason="(\w+)"\} (\d+)$`)

// cutCounts reads warren_http_responses_cut_total from the edge's metrics, by reason.
func cutCounts(t *testing.T, e *edge) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range cutMetric.FindAllStringSubmatch(metrics(t, e), -1) {
		out[m[1]], _ = strconv.Atoi(m[2])
	}
	return out
}

// windowZeroStreams opens one HTTP/2 connection (prior knowledge) to addr whose streams get
// no flow window, and requests path on host n times on it. The connection answers the
// edge's SETTINGS and PINGs and reads everything, as a live client does; it never grants a
// stream a byte of window. It returns the number of streams the edge has reset so far, and
// whether it ended the connection (GOAWAY).
func windowZeroStreams(t *testing.T, addr, host, path string, n int) (state func() (resets int, goaway bool)) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	var mu sync.Mutex // the framer's writes
	require.NoError(t, fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}))
	var resets, goaway int
	var smu sync.Mutex
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			mu.Lock()
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = fr.WritePing(true, f.Data)
				}
			case *http2.RSTStreamFrame:
				smu.Lock()
				resets++
				smu.Unlock()
			case *http2.GoAwayFrame:
				smu.Lock()
				goaway++
				smu.Unlock()
			}
			mu.Unlock()
		}
	}()
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for i := range n {
		hbuf.Reset()
		for _, hf := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: host}, {Name: ":path", Value: path}} {
			require.NoError(t, enc.WriteField(hf))
		}
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hbuf.Bytes(),
			EndStream: true, EndHeaders: true})
		mu.Unlock()
		require.NoError(t, err)
	}
	return func() (int, bool) {
		smu.Lock()
		defer smu.Unlock()
		return resets, goaway > 0
	}
}

// unreadGets opens n HTTP/1.1 connections to addr, each asking for path on host, and never
// reads the answers. Their receive buffers are small, as an attacker's would be: the edge's
// writes block once a few kilobytes wait in the kernel instead of megabytes.
func unreadGets(t *testing.T, addr, host, path string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.(*net.TCPConn).SetReadBuffer(4<<10))
		_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		require.NoError(t, err)
		conns[i] = c
	}
	return conns
}

// openFDs is the number of file descriptors process pid has open.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// activeField finds each tunnel's active_streams in the admin API's list.
var activeField = regexp.MustCompile(`"active_streams":(\d+)`)

// activeStreams is the sum of the edge's tunnels' active_streams (admin API): the requests
// their members are carrying.
func activeStreams(t *testing.T, e *edge) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/api/tunnels", e.admin), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	n := 0
	for _, m := range activeField.FindAllSubmatch(body, -1) {
		k, _ := strconv.Atoi(string(m[1]))
		n += k
	}
	return n
}

// attackTimeout bounds the wait for an attack's responses to be cut: a hundred responses
// filling their clients' buffers take seconds under the race detector.
const attackTimeout = 40 * time.Second

// stallAttack is one of issue 26's attacks on an edge's public side.
type stallAttack struct {
	name string
	// run starts the attack on the edge's public address; the func it returns checks what
	// the client saw once every response was cut, and ends the attack.
	run func(t *testing.T, addr string) (done func())
	// total is the number of responses the attack stalls, budget the rule that cuts those
	// past it, and held how many the budget holds until the stall timeout. (A response that
	// stalls only after the stall timeout cut one held may take its place.)
	total, held int
	budget      string
	// bound is the growth of the edge's resident memory allowed, and why.
	bound int64
}

// TestClientsThatStopReadingCannotExhaustTheEdge runs issue 26's attacks on the edge's
// public side against the example edge and connector processes, each attack on an edge of
// its own with the default budgets of stalled responses and a short stall timeout (3 s), and
// records the edge's resident memory before, at its peak during the attack and after
// (docs/reliability.md has the figures, and those of the edge before the budgets):
//
//   - one HTTP/2 connection with 50 streams to a large download that never get a byte of
//     flow window. Before, each held a member stream's 4 MiB window at the edge, and the
//     member's stream, for ever (+595 MB). Now 4 of them fit in the connection's budget
//     (16 MiB) and the other 46 are reset as they stall, the 4 at the stall timeout; the
//     connection goes on.
//   - 100 HTTP/1.1 connections from one address asking for the download and never reading.
//     Before, +520 MB and 100 connections for ever (no write timeout). Now 8 fit in the
//     address's budget (32 MiB), the other 92 are cut as they stall, the 8 at the stall
//     timeout.
//
// Each time the member's streams are all released, the edge holds no more file descriptors
// than before (the HTTP/2 connection aside, which goes on), and it still serves.
//
// Memory: a stalled response within a budget holds its 4 MiB window, which costs about 3×
// that in resident memory (a yamux receive buffer grows by doubling, and the heap may grow
// to twice what is live before the collector runs): about 50 MB for the connection's budget,
// 100 MB for the address's. A response cut as it stalls holds what its member sent during
// the 20 ms grace and until the cut reached the member, up to about as much again on
// loopback. So the growth allowed is 150 MB for the first attack and 250 MB for the second,
// where the edge before the budgets grew by 300 and 930 MB within 4 s (595 and 520 MB in the
// issue) and kept it for ever. That needs the member's stream to end when the edge cuts the
// response: a yamux stream the edge closes goes on receiving up to its window, and is freed
// only once its connector closes its side too (or after yamux's 5-minute close timeout). The
// bound is checked once the connector has let go of every cut exchange (its backend
// connections are back to what they were); otherwise the test says so, and checks the rest.
// Under -race the memory figures are several times larger and only logged.
func TestClientsThatStopReadingCannotExhaustTheEdge(t *testing.T) {
	port := downloadBackend(t)
	for _, at := range []stallAttack{{
		name: "50 window-zero HTTP/2 streams on one connection",
		run: func(t *testing.T, addr string) func() {
			state := windowZeroStreams(t, addr, "dl.localhost", "/big", 50)
			return func() {
				resets, goaway := state()
				require.Equal(t, 50, resets, "streams reset")
				require.False(t, goaway, "the connection was ended")
			}
		},
		total: 50, held: 4, budget: "conn_budget",
		bound: 150e6,
	}, {
		name: "100 HTTP/1.1 clients that do not read",
		run: func(t *testing.T, addr string) func() {
			conns := unreadGets(t, addr, "dl.localhost", "/big", 100)
			return func() {
				for _, c := range conns {
					c.Close()
				}
			}
		},
		total: 100, held: 8, budget: "ip_budget",
		bound: 250e6,
	}} {
		t.Run(at.name, func(t *testing.T) {
			e := startEdgeWith(t, false, edgeExtra{server: []string{"h2c = true"}, limits: []string{"response_stall_timeout_secs = 3"}})
			c := startConnector(t, "connector", e, token, tunnelConf{name: "dl", proto: "http", subdomain: "dl", localPort: port})
			c.line(t, "tunnel dl: ")
			client := publicClient(t, e)
			get := func() bool {
				resp, err := client.Get("http://dl.localhost/small")
				if err != nil {
					return false
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK && string(body) == "small"
			}
			require.Eventually(t, get, waitTimeout, 20*time.Millisecond)
			client.CloseIdleConnections()
			edgePID, connPID := e.cmd.Process.Pid, c.cmd.Process.Pid
			mb := func(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/1e6) }
			before, edgeFDs, connFDs := rss(t, edgePID), openFDs(t, edgePID), openFDs(t, connPID)

			peak := peakRSS(t, edgePID)
			done := at.run(t, fmt.Sprintf("127.0.0.1:%d", e.http))
			require.Eventually(t, func() bool {
				cuts, all := cutCounts(t, e), 0
				for _, n := range cuts {
					all += n
				}
				return len(cuts) == 4 && all == at.total && cuts[at.budget]+cuts["stall_timeout"] == at.total &&
					cuts["stall_timeout"] >= at.held
			}, attackTimeout, 20*time.Millisecond, "cuts: %v", cutCounts(t, e))
			done()
			top, after := peak(), rss(t, edgePID)
			t.Logf("edge RSS before %s, peak %s (+%s), after the stall timeout %s; cuts %v",
				mb(before), mb(top), mb(top-before), mb(after), cutCounts(t, e))

			// Nothing of the attack is held at the edge any more, and it still serves.
			require.Eventually(t, func() bool { return activeStreams(t, e) == 0 }, waitTimeout, 20*time.Millisecond,
				"member streams still in use")
			require.Regexp(t, `(?m)^warren_http_stalled_response_bytes 0$`, metrics(t, e))
			require.Eventually(t, func() bool { return openFDs(t, edgePID) <= edgeFDs+2 }, waitTimeout, 20*time.Millisecond,
				"the edge holds %d file descriptors, %d before the attack", openFDs(t, edgePID), edgeFDs)
			require.True(t, get(), "the edge does not serve any more")
			client.CloseIdleConnections()

			if slices.Contains(buildFlags, "-race") {
				t.Log("race detector on: memory not checked")
				return
			}
			// The connector has let go of the cut exchanges when its backend connections
			// are closed again.
			released := func() bool { return openFDs(t, connPID) <= connFDs+2 }
			for end := time.Now().Add(5 * time.Second); !released() && time.Now().Before(end); {
				time.Sleep(20 * time.Millisecond)
			}
			if n := openFDs(t, connPID); n > connFDs+2 {
				t.Logf("memory not checked: the connector still holds %d more file descriptors than before, for the "+
					"exchanges the edge cut: their member streams keep what they carried at the edge until the "+
					"connector closes them, which needs the stream reset (else yamux's 5-minute close timeout)", n-connFDs)
				return
			}
			require.Less(t, top-before, at.bound, "growth of the edge's resident memory")
		})
	}
}
