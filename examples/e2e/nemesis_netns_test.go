package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The nemesis's partitions (edge-cut-nats, edge-cut-peers) drop an edge's packets with
// iptables. Rules may change only a network namespace the test made itself, so where it can
// (root, unshare, ip, iptables with the owner match) TestNemesis runs again inside a new
// network namespace (unshare --net) whose loopback carries the whole cluster: the edges,
// the NATS nodes, the connectors, the backends and the clients. There each edge runs with a
// group id of its own (nemEdgeGID), and a partition is a rule of the OUTPUT chain matching
// that group id (-m owner --gid-owner) and the ports of the cut: the NATS nodes' client
// ports, or the peer port both ways. The namespace goes with the last of its processes.
// Elsewhere the partition faults are skipped (each recorded as such) and the rest runs.

// envNemesisNetns is set (to "1") in the test process re-executed inside the namespace;
// envE2EBinDir hands it the binaries TestMain built (it does not build them again).
const (
	envNemesisNetns = "WARREN_NEMESIS_NETNS"
	envE2EBinDir    = "WARREN_E2E_BIN_DIR"
)

// insideNemesisNetns reports whether this test process runs inside the namespace it made.
func insideNemesisNetns() bool { return os.Getenv(envNemesisNetns) == "1" }

var partitionCheck = sync.OnceValue(func() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	for _, cmd := range []string{"unshare", "ip", "iptables"} {
		if _, err := lookSbin(cmd); err != nil {
			return cmd + " not found"
		}
	}
	// The owner match, in a throwaway namespace (nothing outside it changes).
	unshare, _ := lookSbin("unshare")
	ipt, _ := lookSbin("iptables")
	out, err := exec.Command(unshare, "--net", ipt, "-A", "OUTPUT", "-o", "lo", "-p", "tcp", "-m", "owner", "--gid-owner", "1", "-j", "DROP").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("iptables -m owner in a new namespace: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return ""
})

// partitionUnsupported says why the partition faults cannot run here; "" when they can.
func partitionUnsupported() string {
	if insideNemesisNetns() {
		return ""
	}
	if why := partitionCheck(); why != "" {
		return why + " (partitions need root, unshare, ip and iptables with the owner match)"
	}
	return "not inside the test's network namespace"
}

// lookSbin finds a command in PATH or in /usr/sbin, /sbin.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p := dir + "/" + name; fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// runInNemesisNetns runs this test binary's test `run` again inside a new network
// namespace, its output passed through; it reports whether it could (false: run here, the
// partition faults skipped, and why). The child's failure fails t.
func runInNemesisNetns(t *testing.T, run string) (bool, string) {
	if insideNemesisNetns() {
		return false, ""
	}
	if why := partitionCheck(); why != "" {
		return false, why + " (partitions need root, unshare, ip and iptables with the owner match)"
	}
	// A subtest pattern of this run (-run 'TestNemesis/seed=2') holds in the child too.
	if f := flag.Lookup("test.run"); f != nil {
		if _, sub, ok := strings.Cut(f.Value.String(), "/"); ok {
			run += "/" + sub
		}
	}
	unshare, _ := lookSbin("unshare")
	ip, _ := lookSbin("ip")
	args := []string{"--net", "--", "sh", "-c", ip + ` link set lo up && exec "$@"`, "sh", os.Args[0],
		"-test.run", run, "-test.count", "1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout", (time.Until(d) - 30*time.Second).Round(time.Second).String())
	}
	args = append(args, nemesisFlagArgs()...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, unshare, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envNemesisNetns+"=1", envE2EBinDir+"="+binDir)
	cmd.WaitDelay = 10 * time.Second
	t.Logf("running %s again inside a network namespace of its own (partition faults): unshare %s", run, strings.Join(args, " "))
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		t.Errorf("%s inside the test's network namespace failed (exit %d): its output is above", run, ee.ExitCode())
	case err != nil:
		t.Errorf("%s inside the test's network namespace: %v", run, err)
	}
	return true, ""
}

// nemesisFlagArgs are the -nemesis.* flags of this run, for the re-executed test.
func nemesisFlagArgs() []string {
	var out []string
	if *flagNemesisSeeds != 0 {
		out = append(out, "-nemesis.seeds", strconv.Itoa(*flagNemesisSeeds))
	}
	if *flagNemesisSeed != 0 {
		out = append(out, "-nemesis.seed", strconv.FormatUint(*flagNemesisSeed, 10))
	}
	if *flagNemesisKeep {
		out = append(out, "-nemesis.keep")
	}
	if *flagNemesisDuration != 0 {
		out = append(out, "-nemesis.duration", flagNemesisDuration.String())
	}
	return out
}

// cutRules are the iptables rules (after -A/-D) of partition f: the edge's packets to the
// NATS nodes' client ports, or to and from the peer port.
func (c *nemCluster) cutRules(f fault) [][]string {
	e := c.edges[f.Target]
	match := []string{"OUTPUT", "-o", "lo", "-p", "tcp", "-m", "owner", "--gid-owner", strconv.Itoa(e.gid)}
	var rules [][]string
	rule := func(extra ...string) {
		rules = append(rules, append(append(append([]string(nil), match...), extra...), "-j", "DROP"))
	}
	switch f.Kind {
	case faultEdgeCutNATS:
		for _, n := range c.nats {
			rule("--dport", strconv.Itoa(n.client))
		}
	case faultEdgeCutPeers:
		rule("--dport", strconv.Itoa(e.peer))
		rule("--sport", strconv.Itoa(e.peer))
	}
	return rules
}

// iptables adds (op "-A") or deletes ("-D") rules; only inside the test's namespace.
func iptables(op string, rules [][]string) error {
	if !insideNemesisNetns() {
		return errors.New("iptables outside the test's network namespace refused")
	}
	ipt, err := lookSbin("iptables")
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rules {
		if out, err := exec.Command(ipt, append([]string{op}, r...)...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables %s %s: %v: %s", op, strings.Join(r, " "), err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}
