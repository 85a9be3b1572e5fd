// Package wan simulates a slow, lossy link between two processes of the load tool on one
// machine, without netem (which this kernel lacks).
//
// Run starts a program inside a network namespace of its own whose loopback interface
// carries all the traffic. Inside it, Delay sends the TCP and UDP packets of one port (both
// directions) through an NFQUEUE and a small scheduler that holds each packet for the
// configured one-way delay, or drops a share of them, before handing it back to the
// kernel. Packets of other ports are untouched, so for example the control link between a
// connector and the edge can be slowed while public clients and backends stay fast.
//
// It needs root, the ip command (iproute2) and iptables (nft or legacy flavour) with the
// NFQUEUE target; Check says what is missing. Nothing outside the namespace that Run
// creates is changed.
package wan

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvNetns is the environment variable Run sets for the program it starts: the name of
// the namespace (as listed by `ip netns`) the program runs in.
const EnvNetns = "WARREN_WAN_NETNS"

// netnsDir is where `ip netns` keeps the named namespaces.
const netnsDir = "/run/netns"

// Errors a caller may want to tell apart.
var (
	// ErrNotInNamespace is returned by Delay outside a namespace made by Run: Delay never
	// changes the rules of a namespace it did not create.
	ErrNotInNamespace = errors.New("wan: not inside a namespace made by wan.Run")
	// ErrDropped is wrapped by the error a stop function returns when packets were lost
	// that the configured loss did not ask for (the queue overflowed or the kernel could
	// not hand a packet over): the figures measured over that link are not trustworthy.
	ErrDropped = errors.New("wan: packets dropped beyond the configured loss")
	// ErrLate is wrapped by the error a stop function returns when packets were held
	// more than LateTolerance past their delay: this process did not get the CPU in time
	// (an overloaded machine), so the link was slower and more jittery than asked. Run
	// the delaying process alone and at real-time priority (chrt -f) to avoid it.
	ErrLate = errors.New("wan: packets released late")
)

// LateTolerance is how late a packet may leave before stop reports ErrLate.
const LateTolerance = 5 * time.Millisecond

// cancelGrace is how long Run waits after asking the program to stop (SIGTERM on ctx
// cancellation) before it kills it.
const cancelGrace = 5 * time.Second

var checkOnce = sync.OnceValue(check)

// Check reports why a WAN run cannot happen here (not root, no ip, no iptables, no
// NFQUEUE); nil when it can. The first call probes the NFQUEUE target in a short-lived
// namespace of its own; the answer is remembered for the life of the process.
func Check() error { return checkOnce() }

func check() error {
	if os.Geteuid() != 0 {
		return errors.New("wan: needs root (network namespaces and iptables)")
	}
	if _, err := lookCmd("ip"); err != nil {
		return fmt.Errorf("wan: the ip command (iproute2) is missing: %w", err)
	}
	if len(iptablesCandidates()) == 0 {
		return errors.New("wan: iptables is not installed (Debian: apt-get install -y iptables)")
	}
	return probeNFQueue()
}

// iptablesCandidates lists the iptables commands found, the default flavour first and
// the legacy one as a fallback.
func iptablesCandidates() []string {
	var out []string
	for _, name := range []string{"iptables", "iptables-nft", "iptables-legacy"} {
		if p, err := lookCmd(name); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// lookCmd finds a command in PATH or, as root's tools often live there and a PATH
// without them is common, in /usr/sbin and /sbin.
func lookCmd(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p, err2 := exec.LookPath(filepath.Join(dir, name)); err2 == nil {
			return p, nil
		}
	}
	return "", err
}

// ipPath is the ip command; "ip" (and so the error naming it) when it is missing.
func ipPath() string {
	if p, err := lookCmd("ip"); err == nil {
		return p
	}
	return "ip"
}

// InNamespace reports whether this process runs inside a namespace made by Run.
func InNamespace() bool {
	name := os.Getenv(EnvNetns)
	if !validName(name) {
		return false
	}
	mine, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return false
	}
	named, err := os.Stat(filepath.Join(netnsDir, name))
	if err != nil {
		return false
	}
	return os.SameFile(mine, named)
}

// validName accepts only names that Run makes.
func validName(name string) bool {
	if !strings.HasPrefix(name, "warren-wan-") || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

var nsCounter atomic.Uint32

// newName returns a namespace name unique to this call: the process id, a counter and
// random bits (a namespace left behind by a crashed run with a recycled pid cannot clash).
func newName() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("wan: random namespace name: %w", err)
	}
	return fmt.Sprintf("warren-wan-%d-%d-%s", os.Getpid(), nsCounter.Add(1), hex.EncodeToString(b[:])), nil
}

// ipCmd runs `ip args...` and returns its combined output in the error.
func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, ipPath(), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("wan: ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newNamespace creates a named network namespace with its loopback up and returns its
// name and a function deleting it.
func newNamespace(ctx context.Context) (string, func() error, error) {
	name, err := newName()
	if err != nil {
		return "", nil, err
	}
	if err := ipCmd(ctx, "netns", "add", name); err != nil {
		return "", nil, err
	}
	del := func() error {
		// A fresh context: the namespace goes away also when ctx was cancelled.
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return ipCmd(dctx, "netns", "delete", name)
	}
	if err := ipCmd(ctx, "-n", name, "link", "set", "lo", "up"); err != nil {
		return "", nil, errors.Join(err, del())
	}
	return name, del, nil
}

// Run creates a fresh network namespace with a unique name (its lo up), runs argv inside
// it (ip netns exec), stdout/stderr passed through, env WARREN_WAN_NETNS=<name> set, and
// deletes the namespace afterwards, also on error or ctx cancel.
//
// On ctx cancellation the program gets SIGTERM and, cancelGrace later, SIGKILL; Run then
// returns an error wrapping ctx.Err().
func Run(ctx context.Context, argv []string, stdout, stderr io.Writer) (err error) {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("wan: Run needs a program to run")
	}
	if err := Check(); err != nil {
		return err
	}
	name, del, err := newNamespace(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if derr := del(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	cmd := exec.CommandContext(ctx, ipPath(), append([]string{"netns", "exec", name}, argv...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = append(os.Environ(), EnvNetns+"="+name)
	// `ip netns exec` replaces itself with argv[0], so the signal reaches the program.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = cancelGrace
	if err := cmd.Run(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("wan: %s in namespace %s: %w (%w)", argv[0], name, cerr, err)
		}
		return fmt.Errorf("wan: %s in namespace %s: %w", argv[0], name, err)
	}
	return nil
}

// validateDelay refuses what Delay cannot honour.
func validateDelay(port int, oneWay time.Duration, loss float64) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("wan: port %d out of range 1-65535", port)
	}
	if oneWay < 0 || oneWay > time.Minute {
		return fmt.Errorf("wan: one-way delay %v out of range 0-1m", oneWay)
	}
	if !(loss >= 0 && loss < 1) { // also refuses NaN
		return fmt.Errorf("wan: loss %v out of range [0,1)", loss)
	}
	return nil
}

// Delay, inside such a namespace, holds every packet to or from TCP or UDP port `port` on
// lo for oneWay before releasing it (each packet crosses lo once, so a round trip over that
// port costs 2*oneWay), dropping a share `loss` in [0,1); until stop is called, which removes
// the iptables rules and closes the queue. Packets of other ports are untouched.
//
// Packets leave in the order they arrived (one queue, one fixed delay), so no flow is
// reordered. At most 16384 packets are held; the queue does not fail open, so a packet
// that finds it full is dropped and counted rather than let through undelayed. If the
// process dies without stop, the rules stay and the port goes dark (loudly wrong rather
// than silently fast) until the namespace is deleted.
// stop releases the packets still held at once, is safe to call more than once, and
// returns an error wrapping ErrDropped if packets were lost beyond the configured loss
// and one wrapping ErrLate if some left more than LateTolerance after their time.
// Cancelling ctx stops the delay as stop would. Only IPv4 (127.0.0.0/8) is delayed.
//
// The delay is kept by this process: when it is short of CPU, packets leave late. For
// faithful figures call Delay in a process of its own that does nothing else, started at
// real-time priority (e.g. `chrt -f 10`; it needs little CPU): on a loaded 2-core machine
// that took the worst lateness from hundreds of milliseconds to a few.
func Delay(ctx context.Context, port int, oneWay time.Duration, loss float64) (stop func() error, err error) {
	d, err := startDelay(ctx, port, oneWay, loss)
	if err != nil {
		return nil, err
	}
	return d.Stop, nil
}

// Link is one running Delay whose loss can be changed while it runs.
type Link struct{ d *delayer }

// Start is Delay, returning a Link: its SetLoss changes the share dropped while packets
// flow, and its Stop is Delay's stop function.
func Start(ctx context.Context, port int, oneWay time.Duration, loss float64) (*Link, error) {
	d, err := startDelay(ctx, port, oneWay, loss)
	if err != nil {
		return nil, err
	}
	return &Link{d: d}, nil
}

// SetLoss changes the share of the link's packets dropped from now on, in [0,1).
func (l *Link) SetLoss(loss float64) error {
	if !(loss >= 0 && loss < 1) {
		return fmt.Errorf("wan: loss %v out of range [0,1)", loss)
	}
	l.d.setLoss(loss)
	return nil
}

// Stop stops the link as Delay's stop function does.
func (l *Link) Stop() error { return l.d.Stop() }
