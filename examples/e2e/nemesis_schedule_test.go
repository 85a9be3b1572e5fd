package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	// faultConnectorTerm stops a connector with SIGTERM (it drains its tunnels and exits)
	// and starts it again.
	faultConnectorTerm faultKind = "connector-term"
	// faultConnectorDetach has a running connector reload a file without its pool tunnels
	// (alpha-1, alpha-2: web and db) or its solo tunnel (alpha-solo), which drain and leave,
	// then the whole file again, which attaches them again.
	faultConnectorDetach faultKind = "connector-detach"
	// faultKeyRotate is one rotation of pool rot's key: one member reloads with the next key
	// (the key before listed as previous), the other after the hold.
	faultKeyRotate faultKind = "key-rotate"
	// faultEdgeCutNATS drops an edge's packets to every NATS node (iptables in the test's
	// network namespace) for the hold.
	faultEdgeCutNATS faultKind = "edge-cut-nats"
	// faultEdgeCutPeers drops an edge's packets to and from its peers' links for the hold.
	faultEdgeCutPeers faultKind = "edge-cut-peers"
)

// scheduleVersions are the kinds each version of the schedule draws from, in a fixed order
// (the seed picks an index). A version is never changed once a seed of it is a regression
// test: a new kind makes a new version, so that the seed alone still replays the old
// schedules.
var scheduleVersions = [][]faultKind{
	1: {faultEdgeKill, faultEdgeStop, faultNATSKill, faultNATSStop, faultConnectorKill},
	2: {faultEdgeKill, faultEdgeStop, faultNATSKill, faultNATSStop, faultConnectorKill, faultNATSKillAll},
	3: {faultEdgeKill, faultEdgeStop, faultNATSKill, faultNATSStop, faultConnectorKill, faultNATSKillAll,
		faultConnectorTerm, faultConnectorDetach, faultKeyRotate, faultEdgeCutNATS, faultEdgeCutPeers},
}

// scheduleVersion is the version new seeds draw.
const scheduleVersion = 3

// partitionKinds are the faults that need the test's network namespace; where it cannot be
// made they are skipped (recorded as such) and the rest of the schedule runs.
var partitionKinds = []faultKind{faultEdgeCutNATS, faultEdgeCutPeers}

// faultKinds are the kinds of the current version.
var faultKinds = scheduleVersions[scheduleVersion]

// targets is how many parts of the cluster a kind can hit: edges, NATS nodes, connectors
// (alpha-1, alpha-2, alpha-solo, beta-1; the order of startNemesisCluster), or the whole
// NATS cluster.
func (k faultKind) targets() int {
	switch k {
	case faultConnectorKill, faultConnectorTerm:
		return 4
	case faultNATSKillAll:
		return 1
	case faultKeyRotate:
		return 2
	}
	return 3
}

// holdSpread is how much longer than holdMin a fault of kind k may be held: a partition up to
// twice as long as the others, so that some outlast the lease (an edge cut off from NATS
// then loses its members on the other edges) and some do not.
func (k faultKind) holdSpread() time.Duration {
	if slices.Contains(partitionKinds, k) {
		return 2 * holdSpread
	}
	return holdSpread
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
		f.Hold = holdMin + time.Duration(r.Int64N(int64(f.Kind.holdSpread())))
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
	case faultEdgeKill, faultEdgeStop, faultEdgeCutNATS, faultEdgeCutPeers:
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
func (c *nemCluster) apply(f fault, h *history, stop <-chan struct{}) (record, error) {
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
	case faultConnectorTerm:
		k := c.connectors[f.Target]
		_ = k.p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.p.done:
		case <-time.After(nemDrainSecs*time.Second + readyTimeout):
			kill9(k.p)
			err = fmt.Errorf("%s did not exit on SIGTERM", k.name)
		}
		hold()
		rec.End = time.Now()
		if err == nil {
			if err = c.startConnector(k); err == nil {
				err = k.waitLines(readyTimeout)
			}
		}
	case faultConnectorDetach:
		k := c.connectors[f.Target]
		c.detached[k.name] = true
		err = c.reload(k)
		hold()
		c.detached[k.name] = false
		rec.End = time.Now()
		if rerr := c.reload(k); err == nil {
			err = rerr
		}
	case faultKeyRotate:
		// Both members go to the next generation, target first, the other after the hold.
		first, gen := f.Target, c.rotGen[0]+1
		c.rotGen[first] = gen
		err = c.reload(c.connectors[first])
		h.add(record{Type: recKey, Edge: c.connectors[first].name, Answer: rotID(first, gen), Start: rec.Start, End: time.Now()})
		hold()
		rec.End = time.Now()
		c.rotGen[1-first] = gen
		if rerr := c.reload(c.connectors[1-first]); err == nil {
			err = rerr
		}
		h.add(record{Type: recKey, Edge: c.connectors[1-first].name, Answer: rotID(1-first, gen), Start: rec.End, End: time.Now()})
		c.rotDone.Store(int32(gen))
	case faultEdgeCutNATS, faultEdgeCutPeers:
		if !c.netns {
			rec.Err = "skipped: " + partitionUnsupported()
			hold()
			rec.End = time.Now()
			break
		}
		rules := c.cutRules(f)
		err = iptables("-A", rules)
		hold()
		rec.End = time.Now()
		if herr := iptables("-D", rules); err == nil {
			err = herr
		}
	}
	rec.Ready = time.Now()
	if err != nil {
		rec.Err = err.Error()
	}
	if rec.Err == "" && f.Kind == faultKeyRotate {
		rec.Answer = fmt.Sprintf("generation %d", c.rotGen[0])
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

// attack is one try of another tenant, or of tenant alpha with another key, on one of
// tenant alpha's routes.
type attack struct {
	route string // as in the history: "http/pool.localhost", ...
	token string // the attacking connector's tenant token
	// conf returns the connector's tunnels, given the attacking backends' ports.
	conf func(httpBackend, tcpBackend int) string
}

// attacks are the tries, each of which must be refused: tenant beta on alpha's pool with
// alpha's key and pool name, on alpha's solo subdomain, on alpha's TCP pool with its key
// and on alpha's reserved endpoint with its key (refused as another tenant's); tenant alpha
// itself on its pool web with a key the pool never had, and on pool rot with a key it no
// longer has (two generations back, held by no member; before that, one it never had)
// (refused: group key does not match).
func (c *nemCluster) attacks() []attack {
	return []attack{
		{"http/" + hostPool, betaToken, func(h, _ int) string {
			return fmt.Sprintf("  web:\n    proto: http\n    local_port: %d\n    subdomain: pool\n    group: web\n    group_key: %q\n", h, keyAlphaWeb)
		}},
		{"http/" + hostSolo, betaToken, func(h, _ int) string {
			return fmt.Sprintf("  solo:\n    proto: http\n    local_port: %d\n    subdomain: solo\n", h)
		}},
		{"http/" + hostResv, betaToken, func(h, _ int) string {
			return fmt.Sprintf("  resv:\n    proto: http\n    local_port: %d\n    subdomain: resv\n    group: resv\n    group_key: %q\n", h, keyAlphaResv)
		}},
		{"tcp/db", betaToken, func(_, p int) string {
			return fmt.Sprintf("  db:\n    proto: tcp\n    local_port: %d\n    group: db\n    group_key: %q\n", p, keyAlphaDB)
		}},
		{"http/" + hostPool + " (another key)", alphaToken, func(h, _ int) string {
			return fmt.Sprintf("  web:\n    proto: http\n    local_port: %d\n    subdomain: pool\n    group: web\n    group_key: %q\n", h, "nemesis-alpha-web-key-never")
		}},
		{"http/" + hostRot + " (an old key)", alphaToken, func(h, _ int) string {
			key := "nemesis-alpha-rot-key-never"
			if g := int(c.rotDone.Load()); g >= 2 {
				key = rotKey(g - 2)
			}
			return fmt.Sprintf("  rot:\n    proto: http\n    local_port: %d\n    subdomain: rot\n    group: rot\n    group_key: %q\n", h, key)
		}},
	}
}

// The intruders' identities: no history line may show them.
const (
	idIntruder      = "beta/intruder/1/ka"
	idAlphaIntruder = "alpha/intruder/1/kx"
)

const (
	// attackEvery is the pause between two tries.
	attackEvery = 2 * time.Second
	// attackTryTimeout bounds one try: a connector refused at start exits 1 at once; one that
	// registered is left running this long (so the workload may reach it) then killed.
	attackTryTimeout = 8 * time.Second
)

// attacker runs tries on tenant alpha's routes until stopped, each a connector process
// dialling one edge, in an order drawn from seed.
type attacker struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

func startAttacker(c *nemCluster, h *history, seed uint64) *attacker {
	a := &attacker{stop: make(chan struct{})}
	r := rand.New(rand.NewPCG(seed, 0x61747461636b)) // "attack"
	tries := c.attacks()
	backends := map[string][2]int{
		betaToken:  {identityHTTPBackend(c.t, idIntruder), identityTCPBackend(c.t, idIntruder)},
		alphaToken: {identityHTTPBackend(c.t, idAlphaIntruder), identityTCPBackend(c.t, idAlphaIntruder)},
	}
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
			b := backends[try.token]
			rec.Answer, rec.Err = runAttack(conf, e.controlAddr(), try.token, try.conf(b[0], b[1]), a.stop)
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

// runAttack runs one connector with token and tunnels against addr and says how it ended:
// "refused: ..." (another tenant's route, or a key the pool does not hold),
// "unavailable: ..." (the edge could not decide: NATS), "registered: ..." (a line printed:
// a breach), or "no answer".
func runAttack(conf, addr, token, tunnels string, stop <-chan struct{}) (outcome, errText string) {
	if err := os.WriteFile(conf, fmt.Appendf(nil, "server: %s\nauth_token: %q\ndrain_timeout_secs: 1\ntunnels:\n%s", addr, token, tunnels), 0o600); err != nil {
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
	case strings.Contains(errs, "belongs to another tenant") || strings.Contains(errs, "group key does not match"):
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
