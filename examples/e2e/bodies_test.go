//go:build linux

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// openSockets counts the sockets process p holds open, from /proc/<pid>/fd.
func openSockets(t *testing.T, p *proc) int {
	t.Helper()
	n, err := countSockets(p.cmd.Process.Pid)
	require.NoError(t, err)
	return n
}

func countSockets(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		// A descriptor closed since the listing has no link any more: not counted.
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n, nil
}

// rssKiB returns the resident memory of process p in KiB (VmRSS in /proc/<pid>/status).
func rssKiB(t *testing.T, p *proc) int {
	t.Helper()
	n, err := readRSS(p.cmd.Process.Pid)
	require.NoError(t, err)
	return n
}

func readRSS(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// bodyReadingBackend is an HTTP server in the test process that reads each request's body
// before it answers, so that the edge waits for the client's body.
func bodyReadingBackend(t *testing.T) (port int) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, "read")
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// bodyless is what one connection that declared a body and sent none saw: its answer's
// status, and whether the edge closed it (an end of stream or a reset) and when.
type bodyless struct {
	status   int
	closedIn time.Duration
	err      error
}

// declareBodyAndWait dials addr, sends head (declaring a body) and no body, then waits at most
// d for the answer and for the edge to close the connection.
func declareBodyAndWait(addr, head string, d time.Duration) (res bodyless) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return bodyless{err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(d))
	if _, err := io.WriteString(c, head); err != nil {
		return bodyless{err: err}
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return bodyless{err: fmt.Errorf("no answer: %w", err)}
	}
	res.status = resp.StatusCode
	if _, err := io.Copy(io.Discard, br); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		res.err = fmt.Errorf("answered %d, not closed: %w", resp.StatusCode, err)
		return res
	}
	res.closedIn = time.Since(start)
	return res
}

// TestDeclaredBodiesThatNeverComeHoldNoConnections: anonymous clients that declare a body
// and send none, a few hundred at once on the edge process's public port (a POST to a
// tunnel whose backend reads bodies) and on its admin port (GET /healthz with
// Content-Length: 200000), each get their answer (408 once request_body_timeout_secs has
// passed; the admin's 200 at once) and then their connection closed by the edge, which
// holds no socket of theirs afterwards and goes on serving. The edge's open sockets and
// resident memory before, while they are held and after are in the test log.
func TestDeclaredBodiesThatNeverComeHoldNoConnections(t *testing.T) {
	const (
		perPort = 200
		// bound covers request_body_timeout_secs (1 s), as long again for the rest of the
		// body, and a loaded machine.
		bound = 10 * time.Second
	)
	e := startEdgeWith(t, false, edgeExtra{limits: []string{"request_body_timeout_secs = 1"}})
	backend := bodyReadingBackend(t)
	c := startConnector(t, "connector", e, token, tunnelConf{name: "up", proto: "http", subdomain: "up", localPort: backend})
	c.line(t, "tunnel up: ")
	pc := publicClient(t, e)
	ac := &http.Client{Timeout: 5 * time.Second}
	serving := func() {
		t.Helper()
		resp, err := pc.Post("http://up.localhost/", "text/plain", strings.NewReader("body"))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		resp, err = ac.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.admin))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	serving()
	pc.CloseIdleConnections()
	ac.CloseIdleConnections()
	sockets0, rss0 := openSockets(t, e.proc), rssKiB(t, e.proc)

	public := fmt.Sprintf("127.0.0.1:%d", e.http)
	admin := fmt.Sprintf("127.0.0.1:%d", e.admin)
	type target struct {
		addr, head string
		status     int
	}
	targets := []target{
		{public, "POST / HTTP/1.1\r\nHost: up.localhost\r\nContent-Length: 1000\r\n\r\n", http.StatusRequestTimeout},
		{admin, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200000\r\n\r\n", http.StatusOK},
	}
	results := make([][]bodyless, len(targets))
	clientsDone := make(chan struct{})
	var wg sync.WaitGroup
	for i, tg := range targets {
		results[i] = make([]bodyless, perPort)
		for j := range perPort {
			wg.Go(func() { results[i][j] = declareBodyAndWait(tg.addr, tg.head, bound) })
		}
	}
	// The most the edge holds meanwhile, sampled until every client is done.
	var socketsHeld, rssHeld int
	pid := e.cmd.Process.Pid
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if n, err := countSockets(pid); err == nil {
				socketsHeld = max(socketsHeld, n)
			}
			if n, err := readRSS(pid); err == nil {
				rssHeld = max(rssHeld, n)
			}
			select {
			case <-clientsDone:
				return
			case <-tick.C:
			}
		}
	}()
	wg.Wait()
	close(clientsDone)
	<-sampled

	for i, tg := range targets {
		var slowest time.Duration
		failed, firstErr := 0, error(nil)
		for _, r := range results[i] {
			if r.err == nil && r.status != tg.status {
				r.err = fmt.Errorf("answered %d, want %d", r.status, tg.status)
			}
			if r.err != nil {
				if failed++; firstErr == nil {
					firstErr = r.err
				}
				continue
			}
			slowest = max(slowest, r.closedIn)
		}
		if failed > 0 {
			t.Errorf("%d of %d connections to %s: %v", failed, perPort, tg.addr, firstErr)
			continue
		}
		t.Logf("%d connections to %s: answered %d, all closed by the edge within %s", perPort, tg.addr, tg.status, slowest.Round(time.Millisecond))
	}
	if t.Failed() {
		t.Logf("edge sockets: %d before, %d held; edge RSS: %d KiB before, %d KiB held", sockets0, socketsHeld, rss0, rssHeld)
		t.FailNow()
	}
	var sockets int
	require.Eventually(t, func() bool {
		sockets = openSockets(t, e.proc)
		return sockets <= sockets0
	}, bound, 10*time.Millisecond, "the edge still holds sockets of closed connections")
	rss := rssKiB(t, e.proc)
	t.Logf("edge sockets: %d before, %d held, %d after; edge RSS: %d KiB before, %d KiB held, %d KiB after",
		sockets0, socketsHeld, sockets, rss0, rssHeld, rss)
	serving()
}
