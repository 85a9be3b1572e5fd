package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"testing"

	"github.com/stretchr/testify/require"
)

// NATS that loses acknowledged writes (issue 28, point 6). The cluster asks JetStream to
// fsync before it acknowledges (sync_interval: always) and keeps the route bucket in 3
// replicas; a NATS cluster whose every node comes back from a store missing its last writes
// (a power loss with the disks' caches lost, a restore from a backup) is emulated here by
// restoring a copy of the three store directories taken earlier in the run. What must hold
// then: no route passes to another tenant while its owner's connectors come back (within
// route_ttl_secs), and an older key that the lost writes had retired does not take a pool
// back.

// The rollback's steps, as the history records them (no schedule draws them).
const (
	// faultNATSStoreCopy is the copy of the three stores (the nodes stopped for it).
	faultNATSStoreCopy faultKind = "nats-store-copy"
	// faultNATSRollback kills every NATS node and restarts it on the copy of its store.
	faultNATSRollback faultKind = "nats-rollback"
)

// nemesisRollbackSeed seeds the run's workload and attacker (no fault schedule: the steps
// are fixed).
const nemesisRollbackSeed = 28

// hostLate is a solo route tenant alpha claims after the stores' copy: the rollback loses
// its record.
const hostLate = "late.localhost"

// idAlphaLate answers for hostLate.
const idAlphaLate = "alpha/late/1/-"

func TestNemesisStoreRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("the nemesis runs the cluster for about a minute; not under -short")
	}
	r := beginNemesis(t, schedule{Seed: nemesisRollbackSeed, Version: scheduleVersion}, nemLeaseSecs*time.Second)
	defer r.stopAll()
	c, h := r.c, r.h
	start := time.Now()

	// 1. The copy: every node stopped at once, so that the three stores are of one moment,
	// as after a power loss; then the nodes go on.
	snap := filepath.Join(c.dir, "stores-copy")
	require.NoError(t, os.Mkdir(snap, 0o700))
	for _, n := range c.nats {
		require.NoError(t, n.p.cmd.Process.Signal(syscall.SIGSTOP))
	}
	var cpErr error
	for _, n := range c.nats {
		if out, err := exec.Command("cp", "-a", n.store(c.dir), snap).CombinedOutput(); err != nil && cpErr == nil {
			cpErr = fmt.Errorf("cp: %v: %s", err, out)
		}
	}
	for _, n := range c.nats {
		require.NoError(t, n.p.cmd.Process.Signal(syscall.SIGCONT))
	}
	require.NoError(t, cpErr)
	copied := record{Type: recFault, Kind: string(faultNATSStoreCopy), Edge: "nats-*", Start: time.Now(), End: time.Now(), Ready: time.Now()}
	h.add(copied)

	// 2. Writes the rollback loses: tenant alpha claims hostLate (a solo tunnel added to
	// alpha-solo's file), and pool rot's key rotates twice (generation 2, the route recording
	// it; generation 0 is then held by no member).
	time.Sleep(time.Second)
	solo := c.connectors[2]
	withLate := solo.tunnels
	lateBackend := identityHTTPBackend(t, idAlphaLate)
	solo.tunnels = func() string {
		return withLate() + fmt.Sprintf("  late:\n    proto: http\n    local_port: %d\n    subdomain: late\n", lateBackend)
	}
	solo.lines = append(solo.lines, "tunnel late: ")
	require.NoError(t, c.reload(solo))
	for range 2 {
		rec, err := c.apply(fault{Kind: faultKeyRotate, Target: 0, Hold: time.Second}, h, r.stopped)
		h.add(rec)
		require.NoError(t, err)
		time.Sleep(time.Second)
	}
	time.Sleep(2 * time.Second) // acknowledged, fsynced, and replicated well before the rollback

	// 3. The owner of hostLate goes down; then every NATS node is killed and restarted on the
	// copy of its store.
	killAt := time.Now()
	kill9(solo.p)
	rollback := record{Type: recFault, Kind: string(faultNATSRollback), Edge: "nats-*", Start: time.Now()}
	for _, n := range c.nats {
		kill9(n.p)
	}
	for _, n := range c.nats {
		require.NoError(t, os.RemoveAll(n.store(c.dir)))
		out, err := exec.Command("cp", "-a", filepath.Join(snap, filepath.Base(n.store(c.dir))), n.store(c.dir)).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	rollback.End = time.Now()
	for _, n := range c.nats {
		require.NoError(t, c.startNATS(n))
	}
	for _, n := range c.nats {
		require.NoError(t, waitJetStream(n.url(), readyTimeout))
	}
	rollback.Ready = time.Now()
	h.add(rollback)

	// 4. While the owner is away, tenant beta tries hostLate, and tenant alpha pool rot with
	// its generation-0 key, again and again; then the owner comes back and must get hostLate.
	betaHTTP, alphaHTTP := identityHTTPBackend(t, idIntruder), identityHTTPBackend(t, idAlphaIntruder)
	away := time.Now().Add(3 * c.lease)
	for i := 0; time.Now().Before(away); i++ {
		conf := filepath.Join(c.dir, fmt.Sprintf("rollback-attack-%d.yml", i))
		e := c.edges[i%len(c.edges)]
		try := record{Type: recAttack, Route: "http/" + hostLate, Edge: e.id, Start: time.Now()}
		tunnels := fmt.Sprintf("  late:\n    proto: http\n    local_port: %d\n    subdomain: late\n", betaHTTP)
		token := betaToken
		if i%2 == 1 {
			try.Route = "http/" + hostRot + " (an old key)"
			tunnels = fmt.Sprintf("  rot:\n    proto: http\n    local_port: %d\n    subdomain: rot\n    group: rot\n    group_key: %q\n", alphaHTTP, rotKey(0))
			token = alphaToken
		}
		try.Answer, try.Err = runAttack(conf, e.controlAddr(), token, tunnels, r.stopped)
		try.End = time.Now()
		h.add(try)
		if strings.HasPrefix(try.Answer, "registered") {
			t.Errorf("after the rollback, while its owner was away: %s", try)
		}
	}
	down := record{Type: recFault, Kind: string(faultConnectorKill), Edge: solo.name, Start: killAt, End: time.Now()}
	require.NoError(t, c.startConnector(solo))
	require.NoError(t, solo.waitLines(readyTimeout), "alpha-solo, back after the rollback, did not get its routes (hostLate among them) again")
	down.Ready = time.Now()
	h.add(down)
	t.Logf("rollback at %v after the copy; owner away %v; %s", rollback.Start.Sub(copied.Start).Round(time.Millisecond),
		down.Ready.Sub(killAt).Round(time.Millisecond), solo.p.stdout.String())

	r.finish(down.Ready, time.Since(start))
}
