package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The nemesis's faults and its seeded schedule (nemesis_test.go).

// faultKind is a kind of fault the nemesis applies; each heals itself after its hold.
type faultKind string

const (
	// faultEdgeKill kills an edge with SIGKILL and starts it again after the hold.
	faultEdgeKill faultKind = "edge-kill"
	// faultEdgeStop stops an edge with SIGSTOP (a long GC pause, a frozen VM) and
	// continues it with SIGCONT after the hold.
	faultEdgeStop faultKind = "edge-stop"
	// faultNATSKill kills one NATS node with SIGKILL and starts it again (same store).
	faultNATSKill faultKind = "nats-kill"
	// faultNATSStop stops one NATS node with SIGSTOP, then continues it.
	faultNATSStop faultKind = "nats-stop"
	// faultConnectorKill kills a connector with SIGKILL and starts it again.
	faultConnectorKill faultKind = "connector-kill"
	// faultNATSKillAll kills every NATS node with SIGKILL at once and starts them again
	// (same stores: JetStream fsyncs before it acknowledges).
	faultNATSKillAll faultKind = "nats-kill-all"
)

// scheduleVersions are the kinds each version of the schedule draws from, in a fixed order
// (the seed picks an index). A version is never changed once a seed of it is a regression
// test: a new kind makes a new version, so that the seed alone still replays the old
// schedules. Partitions (iptables in a network namespace) are not among them yet.
var scheduleVersions = [][]faultKind{
	1: {faultEdgeKill, faultEdgeStop, faultNATSKill, faultNATSStop, faultConnectorKill},
	2: {faultEdgeKill, faultEdgeStop, faultNATSKill, faultNATSStop, faultConnectorKill, faultNATSKillAll},
}

// scheduleVersion is the version new seeds draw.
const scheduleVersion = 2

// faultKinds are the kinds of the current version.
var faultKinds = scheduleVersions[scheduleVersion]

// targets is how many parts of the cluster a kind can hit: edges, NATS nodes, connectors
// (alpha-1, alpha-2, alpha-solo, beta-1; the order of startNemesisCluster), or the whole
// NATS cluster.
func (k faultKind) targets() int {
	switch k {
	case faultConnectorKill:
		return 4
	case faultNATSKillAll:
		return 1
	}
	return 3
}

// fault is one step of a schedule: wait Pause, apply Kind to Target, hold it for Hold, heal.
type fault struct {
	Pause  time.Duration
	Kind   faultKind
	Target int
	Hold   time.Duration
}

// schedule is what a seed stands for: the faults, in order, and the duration they were
// drawn to fill.
type schedule struct {
	Seed     uint64
	Version  int
	Duration time.Duration
	Faults   []fault
}

const (
	// Each fault is held for holdMin plus up to holdSpread: from a blip well inside the lease
	// to several leases.
	holdMin    = 500 * time.Millisecond
	holdSpread = 4500 * time.Millisecond
	// Between a fault's heal and the next fault: pauseMin plus up to pauseSpread. A pause
	// shorter than settleBound lets the next fault hit a cluster still recovering.
	pauseMin    = 1 * time.Second
	pauseSpread = 5 * time.Second
	// healCost is what the schedule reckons a heal takes (a process start), to fill about
	// Duration.
	healCost = 1500 * time.Millisecond
)

// newSchedule draws the faults of seed for about d from the kinds of version. It depends
// on nothing but its arguments: the seed alone replays the schedule.
func newSchedule(seed uint64, version int, d time.Duration) schedule {
	kinds := scheduleVersions[version]
	r := rand.New(scheduleSource(seed, version))
	s := schedule{Seed: seed, Version: version, Duration: d}
	var at time.Duration
	for {
		f := fault{Pause: pauseMin + time.Duration(r.Int64N(int64(pauseSpread)))}
		f.Kind = kinds[r.IntN(len(kinds))]
		f.Target = r.IntN(f.Kind.targets())
		f.Hold = holdMin + time.Duration(r.Int64N(int64(holdSpread)))
		f.Hold = f.Hold.Round(time.Millisecond)
		f.Pause = f.Pause.Round(time.Millisecond)
		at += f.Pause + f.Hold + healCost
		if at > d && len(s.Faults) > 0 {
			return s
		}
		s.Faults = append(s.Faults, f)
	}
}

// scheduleSource is the random source of a seed's schedule. Version 1 seeded PCG with the
// seed itself, and nearby seeds drew correlated schedules (over seeds 0-39 one kind and
// target came up 3 times where 13 were expected); from version 2, ChaCha8 keyed by the seed.
func scheduleSource(seed uint64, version int) rand.Source {
	if version == 1 {
		return rand.NewPCG(seed, 0x6e656d65736973) // "nemesis"
	}
	var key [32]byte
	copy(key[:], "warren nemesis schedule")
	binary.LittleEndian.PutUint64(key[24:], seed)
	return rand.NewChaCha8(key)
}

func (s schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (schedule version %d), %v, %d faults:", s.Seed, s.Version, s.Duration, len(s.Faults))
	for i, f := range s.Faults {
		fmt.Fprintf(&b, "\n  %2d. after %v: %s %s for %v", i+1, f.Pause, f.Kind, f.target(), f.Hold)
	}
	return b.String()
}

// target names the fault's target.
func (f fault) target() string {
	switch f.Kind {
	case faultEdgeKill, faultEdgeStop:
		return fmt.Sprintf("edge-%d", f.Target+1)
	case faultNATSKill, faultNATSStop:
		return fmt.Sprintf("nats-%d", f.Target+1)
	case faultNATSKillAll:
		return "nats-*"
	default:
		return []string{"alpha-1", "alpha-2", "alpha-solo", "beta-1"}[f.Target]
	}
}

// readyTimeout bounds a heal: the restarted process serving again.
const readyTimeout = 30 * time.Second

// apply applies f to c, holds it, heals it and returns its record; stop cuts the hold short.
// An error means the cluster could not be healed (a process that does not come back).
func (c *nemCluster) apply(f fault, stop <-chan struct{}) (record, error) {
	rec := record{Type: recFault, Kind: string(f.Kind), Edge: f.target(), Start: time.Now()}
	hold := func() {
		select {
		case <-time.After(f.Hold):
		case <-stop:
		}
	}
	var err error
	switch f.Kind {
	case faultEdgeKill:
		e := c.edges[f.Target]
		kill9(e.p)
		hold()
		rec.End = time.Now()
		rec.Starts, err = c.superviseEdge(e)
	case faultEdgeStop:
		p := c.edges[f.Target].p
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		hold()
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		rec.End = time.Now()
	case faultNATSKill:
		n := c.nats[f.Target]
		kill9(n.p)
		hold()
		rec.End = time.Now()
		if err = c.startNATS(n); err == nil {
			err = waitJetStream(n.url(), readyTimeout)
		}
	case faultNATSKillAll:
		for _, n := range c.nats {
			kill9(n.p)
		}
		hold()
		rec.End = time.Now()
		for _, n := range c.nats {
			if err == nil {
				err = c.startNATS(n)
			}
		}
		for _, n := range c.nats {
			if err == nil {
				err = waitJetStream(n.url(), readyTimeout)
			}
		}
	case faultNATSStop:
		p := c.nats[f.Target].p
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		hold()
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		rec.End = time.Now()
	case faultConnectorKill:
		k := c.connectors[f.Target]
		kill9(k.p)
		hold()
		rec.End = time.Now()
		if err = c.startConnector(k); err == nil {
			err = k.waitLines(readyTimeout)
		}
	}
	rec.Ready = time.Now()
	if err != nil {
		rec.Err = err.Error()
	}
	return rec, err
}

// superviseEdge starts e as a supervisor would (systemd's Restart=on-failure): an edge
// that cannot reach NATS exits 2 at start (examples/edge), e.g. while a NATS node that
// just restarted catches up; it is started again a second later, until readyTimeout. It
// returns how many starts it took.
func (c *nemCluster) superviseEdge(e *nemEdge) (int, error) {
	deadline := time.Now().Add(readyTimeout)
	for starts := 1; ; starts++ {
		err := c.startEdge(e)
		if err == nil || time.Now().After(deadline) {
			return starts, err
		}
		select {
		case <-e.p.done:
		default:
			return starts, err // up but not answering: not a start to retry
		}
		time.Sleep(time.Second)
	}
}

// waitLines waits until k's current process printed each of its lines.
func (k *nemConnector) waitLines(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		out := k.p.stdout.String()
		missing := ""
		for _, prefix := range k.lines {
			if !strings.Contains(out, "\n"+prefix) && !strings.HasPrefix(out, prefix) {
				missing = prefix
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-k.p.done:
			return fmt.Errorf("%s exited with %d before printing %q; stderr:\n%s", k.name, k.p.code, missing, k.p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s printed no %q within %v", k.name, missing, d)
		}
	}
}

// attack is one try of tenant beta on one of tenant alpha's routes.
type attack struct {
	route string // as in the history: "http/pool.localhost", ...
	conf  string // the connector's tunnels
}

// attacks are the tries: alpha's pool with alpha's key and pool name, alpha's solo
// subdomain, alpha's TCP pool with its key, alpha's reserved endpoint with its key. Each must
// be refused as another tenant's.
func attacks(httpBackend, tcpBackend int) []attack {
	return []attack{
		{"http/" + hostPool, fmt.Sprintf("  web:\n    proto: http\n    local_port: %d\n    subdomain: pool\n    group: web\n    group_key: %q\n", httpBackend, keyAlphaWeb)},
		{"http/" + hostSolo, fmt.Sprintf("  solo:\n    proto: http\n    local_port: %d\n    subdomain: solo\n", httpBackend)},
		{"http/" + hostResv, fmt.Sprintf("  resv:\n    proto: http\n    local_port: %d\n    subdomain: resv\n    group: resv\n    group_key: %q\n", httpBackend, keyAlphaResv)},
		{"tcp/db", fmt.Sprintf("  db:\n    proto: tcp\n    local_port: %d\n    group: db\n    group_key: %q\n", tcpBackend, keyAlphaDB)},
	}
}

// idIntruder is what the attacking tenant's backend answers: no history line may show it.
const idIntruder = "beta/intruder/1/ka"

const (
	// attackEvery is the pause between two tries.
	attackEvery = 2 * time.Second
	// attackTryTimeout bounds one try: a connector refused at start exits 1 at once; one that
	// registered is left running this long (so the workload may reach it) then killed.
	attackTryTimeout = 8 * time.Second
)

// attacker runs tries of tenant beta on tenant alpha's routes until stopped, each a
// connector process dialling one edge, in an order drawn from seed.
type attacker struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

func startAttacker(c *nemCluster, h *history, seed uint64, httpBackend, tcpBackend int) *attacker {
	a := &attacker{stop: make(chan struct{})}
	r := rand.New(rand.NewPCG(seed, 0x61747461636b)) // "attack"
	tries := attacks(httpBackend, tcpBackend)
	a.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-a.stop:
				return
			case <-time.After(attackEvery):
			}
			try, e := tries[r.IntN(len(tries))], c.edges[r.IntN(len(c.edges))]
			conf := filepath.Join(c.dir, fmt.Sprintf("attack-%d.yml", i))
			rec := record{Type: recAttack, Route: try.route, Edge: e.id, Start: time.Now()}
			rec.Answer, rec.Err = runAttack(conf, e.controlAddr(), try.conf, a.stop)
			rec.End = time.Now()
			h.add(rec)
		}
	})
	return a
}

func (a *attacker) close() {
	close(a.stop)
	a.wg.Wait()
}

// runAttack runs one connector of tenant beta with tunnels against addr and says how it
// ended: "refused: ..." (another tenant's route), "unavailable: ..." (the edge could not
// decide: NATS), "registered: ..." (a line printed: a breach), or "no answer".
func runAttack(conf, addr, tunnels string, stop <-chan struct{}) (outcome, errText string) {
	if err := os.WriteFile(conf, fmt.Appendf(nil, "server: %s\nauth_token: %q\ndrain_timeout_secs: 1\ntunnels:\n%s", addr, betaToken, tunnels), 0o600); err != nil {
		return "", err.Error()
	}
	var stdout, stderr lockedBuffer
	cmd := exec.Command(filepath.Join(binDir, "connector"), "start", "--config", conf)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=100")
	if err := cmd.Start(); err != nil {
		return "", err.Error()
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-stop:
		_ = cmd.Process.Kill()
		<-done
	case <-time.After(attackTryTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
	out, errs := strings.TrimSpace(stdout.String()), stderr.String()
	switch {
	case out != "":
		return "registered: " + out, ""
	case strings.Contains(errs, "belongs to another tenant"):
		return "refused: " + lastLine(errs), ""
	case strings.Contains(errs, "unavailable") || strings.Contains(errs, "connection refused"):
		return "unavailable: " + lastLine(errs), ""
	case cmd.ProcessState != nil && cmd.ProcessState.Exited():
		return "other: " + lastLine(errs), ""
	}
	return "no answer", ""
}

func lastLine(s string) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	return string(lines[len(lines)-1])
}
