package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// The history of one run (nemesis_test.go): every request and TCP connection of the
// workload, every fault, every attempt of the other tenant on the first tenant's routes,
// one JSON object a line, appended as they end; the checker reads the same records.

// Record types.
const (
	recHTTP   = "http"   // one public HTTP request
	recTCP    = "tcp"    // one public TCP connection
	recFault  = "fault"  // one fault, from its start to when it healed
	recAttack = "attack" // one connector of another tenant trying a route
	// recKey is a member of pool rot reloaded with a key generation: Edge is its connector,
	// Answer the identity it answers with from then on, End when its reload returned.
	recKey = "key"
)

// record is one line of the history.
type record struct {
	Seq  int    `json:"seq"`
	Type string `json:"type"`
	// Route is what was asked: "http/<host>" or "tcp/<port>"; for an attack, the route tried.
	Route string `json:"route,omitempty"`
	// Edge is the edge the client (or the attacking connector) went to; for a fault, its target.
	Edge  string    `json:"edge,omitempty"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Status is the HTTP status (0 for TCP or when no answer came).
	Status int `json:"status,omitempty"`
	// Answer is the identity that answered ("tenant/pool/member/key"), or for an attack
	// its outcome ("refused: ...", "unavailable: ...", "registered: ...", "no answer").
	Answer string `json:"answer,omitempty"`
	Err    string `json:"err,omitempty"`
	// Kind is a fault's kind; Ready is when what it killed was serving again.
	Kind  string    `json:"kind,omitempty"`
	Ready time.Time `json:"ready,omitzero"`
	// Starts is how many starts a killed edge took to serve again (an edge that cannot reach
	// NATS exits at start, and its supervisor starts it again).
	Starts int `json:"starts,omitempty"`
}

func (r record) failed() bool {
	return r.Err != "" || (r.Type == recHTTP && r.Status != http.StatusOK)
}

func (r record) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// history appends records to a file and keeps them for the checker.
type history struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	recs []record
}

func newHistory(path string) (*history, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &history{f: f, w: bufio.NewWriter(f)}, nil
}

func (h *history) add(r record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Seq = len(h.recs)
	h.recs = append(h.recs, r)
	b, _ := json.Marshal(r)
	_, _ = h.w.Write(append(b, '\n'))
}

func (h *history) records() []record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]record(nil), h.recs...)
}

func (h *history) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.w.Flush(); err != nil {
		return err
	}
	return h.f.Close()
}

const (
	// workInterval is each client's pause between two requests or connections: 24 clients
	// (5 HTTP hosts and 3 TCP ports through each of 3 edges) make about 80 a second.
	workInterval = 300 * time.Millisecond
	// workTimeout bounds one request or connection (a stopped edge answers nothing).
	workTimeout = 3 * time.Second
)

// nemHTTPHosts are the HTTP routes the workload asks for.
var nemHTTPHosts = []string{hostPool, hostSolo, hostResv, hostBetaPool, hostRot}

// workload runs one client per edge and route until stopped.
type workload struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	idle   []func()
}

// startWorkload starts the clients of c, recording into h.
func startWorkload(c *nemCluster, h *history, seed uint64) *workload {
	ctx, cancel := context.WithCancel(context.Background())
	w := &workload{cancel: cancel}
	n := 0
	for _, e := range c.edges {
		for _, host := range nemHTTPHosts {
			addr := e.httpAddr()
			tr := &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{Timeout: workTimeout}).DialContext(ctx, "tcp", addr)
			}}
			client := &http.Client{Timeout: workTimeout, Transport: tr}
			w.idle = append(w.idle, tr.CloseIdleConnections)
			r := rand.New(rand.NewPCG(seed, uint64(n)))
			n++
			w.wg.Go(func() { w.loopHTTP(ctx, h, client, e.id, host, r) })
		}
		for port := c.tcpLo; port <= c.tcpHi; port++ {
			addr := net.JoinHostPort(e.host, fmt.Sprint(port))
			r := rand.New(rand.NewPCG(seed, uint64(n)))
			n++
			w.wg.Go(func() { w.loopTCP(ctx, h, addr, e.id, port, r) })
		}
	}
	return w
}

// stop stops the clients and closes their idle connections.
func (w *workload) stop() {
	w.cancel()
	w.wg.Wait()
	for _, f := range w.idle {
		f()
	}
}

// pause waits about workInterval (jittered so that the clients do not beat in step).
func pause(ctx context.Context, r *rand.Rand) bool {
	d := workInterval/2 + time.Duration(r.Int64N(int64(workInterval)))
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (w *workload) loopHTTP(ctx context.Context, h *history, client *http.Client, edge, host string, r *rand.Rand) {
	for pause(ctx, r) {
		rec := record{Type: recHTTP, Route: "http/" + host, Edge: edge, Start: time.Now()}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/", nil)
		if err != nil {
			panic(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			rec.Status = resp.StatusCode
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rec.Answer = string(body)
			} else if len(body) > 0 {
				rec.Err = fmt.Sprintf("status %d: %.80s", resp.StatusCode, body)
			} else {
				rec.Err = fmt.Sprintf("status %d", resp.StatusCode)
			}
			err = rerr
		}
		if err != nil {
			rec.Err = err.Error()
		}
		rec.End = time.Now()
		if ctx.Err() != nil {
			return // stopped by the test, not failed
		}
		h.add(rec)
	}
}

func (w *workload) loopTCP(ctx context.Context, h *history, addr, edge string, port int, r *rand.Rand) {
	for pause(ctx, r) {
		rec := record{Type: recTCP, Route: fmt.Sprintf("tcp/%d", port), Edge: edge, Start: time.Now()}
		id, err := tcpExchange(ctx, addr, workTimeout)
		rec.Answer = id
		if err != nil {
			rec.Err = err.Error()
		}
		rec.End = time.Now()
		if ctx.Err() != nil {
			return
		}
		h.add(rec)
	}
}
