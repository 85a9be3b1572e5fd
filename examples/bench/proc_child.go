package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
)

// modulePath is Warren's module: the process layout builds its example mains from it.
const modulePath = "github.com/warren-tunnel/warren"

// procChild is one process of the process layout: a built example main (edge, connector)
// or this binary re-executed in one of its hidden roles (backend, relay, load generator).
type procChild struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // the roles stop when it is closed; nil for the example mains
	lines  chan string    // stdout, line by line (buffered; a role answers one line per job)
	stderr *tailBuffer    // the last 8 KiB of stderr, for error messages
	exited chan struct{}  // closed once the process has been waited for
	once   sync.Once
	err    error // of stop
	// termIsExit: dying of the SIGTERM stop sends is a clean exit (frps and frpc do not
	// catch it).
	termIsExit bool
}

// procChildren are the process layout's children still running: stop waits for each, and
// a test checks that none is left.
var procChildren = struct {
	sync.Mutex
	m map[*procChild]struct{}
}{m: map[*procChild]struct{}{}}

// runningProcChildren returns how many children of the process layout are still running.
func runningProcChildren() int {
	procChildren.Lock()
	defer procChildren.Unlock()
	return len(procChildren.m)
}

// procChildPIDs returns the PIDs of the running children, for the CPU meter.
func procChildPIDs() []int {
	procChildren.Lock()
	defer procChildren.Unlock()
	var out []int
	for c := range procChildren.m {
		out = append(out, c.cmd.Process.Pid)
	}
	return out
}

// stopProcChildren kills every child still running and waits for it (tests, and the last
// resort on the way out).
func stopProcChildren() {
	procChildren.Lock()
	var cs []*procChild
	for c := range procChildren.m {
		cs = append(cs, c)
	}
	procChildren.Unlock()
	for _, c := range cs {
		_ = c.cmd.Process.Kill()
		_ = c.stop(0)
	}
}

// startProcChild starts bin with args. With role set, the child gets a stdin pipe (it stops
// when the pipe closes) and ignores SIGINT; otherwise it is stopped with SIGTERM. echo, when
// not nil, also receives its stderr.
func startProcChild(name, bin string, args []string, role bool, echo io.Writer) (*procChild, error) {
	c := &procChild{name: name, lines: make(chan string, 64), stderr: &tailBuffer{max: 8 << 10}, exited: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.SysProcAttr = childAttrs() // killed by the kernel if this process dies first
	// A binary built with -race (the tests') otherwise sleeps 1 s on exit.
	c.cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	c.cmd.Stderr = c.stderr
	if echo != nil {
		c.cmd.Stderr = io.MultiWriter(c.stderr, echo)
	}
	var err error
	if role {
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	procChildren.Lock()
	procChildren.m[c] = struct{}{}
	procChildren.Unlock()
	scanned := make(chan struct{})
	go func() { // owned: ends at the child's EOF, before Wait below returns
		defer close(scanned)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // nobody asked for it (a connector's progress lines)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { // owned: stop waits for exited
		<-scanned
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *procChild) pid() int { return c.cmd.Process.Pid }

// stop ends the child: its stdin is closed (roles) or it gets SIGTERM (example mains, which
// then drain); after grace it is killed. stop waits for it and is idempotent; it returns an
// error when the child had to be killed or exited with a failure.
func (c *procChild) stop(grace time.Duration) error {
	c.once.Do(func() {
		if c.stdin != nil {
			_ = c.stdin.Close()
		} else {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.exited
			if grace > 0 {
				c.err = fmt.Errorf("%s did not exit within %s of being told to; killed", c.name, grace)
			}
		}
		procChildren.Lock()
		delete(procChildren.m, c)
		procChildren.Unlock()
		if st := c.cmd.ProcessState; c.err == nil && grace > 0 && st != nil && !st.Success() && !(c.termIsExit && killedBy(st, syscall.SIGTERM)) {
			c.err = fmt.Errorf("%s: %s: %s", c.name, st, c.stderr)
		}
	})
	return c.err
}

// killedBy reports whether the process ended of signal sig.
func killedBy(st *os.ProcessState, sig syscall.Signal) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// readLine returns the child's next stdout line, or an error when it exits first, ctx ends
// or timeout passes.
func (c *procChild) readLine(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-c.lines:
		return l, nil
	case <-c.exited:
		select {
		case l := <-c.lines:
			return l, nil
		default:
		}
		return "", fmt.Errorf("%s exited: %s: %s", c.name, c.cmd.ProcessState, c.stderr)
	case <-t.C:
		return "", fmt.Errorf("%s did not answer within %s: %s", c.name, timeout, c.stderr)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// readJSON decodes the child's next stdout line into v.
func (c *procChild) readJSON(ctx context.Context, timeout time.Duration, v any) error {
	l, err := c.readLine(ctx, timeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(l), v); err != nil {
		return fmt.Errorf("%s said %q: %w", c.name, l, err)
	}
	return nil
}

// call sends one job (a JSON line) to a role's stdin and decodes its answer into out.
func (c *procChild) call(ctx context.Context, timeout time.Duration, job, out any) error {
	b, err := json.Marshal(job)
	if err != nil {
		return err
	}
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("sending a job to %s: %w (%s)", c.name, err, c.stderr)
	}
	return c.readJSON(ctx, timeout, out)
}

// stopAll stops children concurrently and returns the first error.
func stopAll(cs []*procChild, grace time.Duration) error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		if c != nil {
			wg.Go(func() { errs[i] = c.stop(grace) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// raceBuilt reports whether this binary was built with the race detector (then the example
// mains are too, which reuses the test build's cache).
func raceBuilt() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// buildMains builds examples/edge and examples/connector into dir with the Go toolchain, as
// a new user would, and returns their paths. It needs Warren's source: the current
// directory must be inside the checkout.
func buildMains(ctx context.Context, dir string) (edgeBin, connectorBin string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("-layout processes builds examples/edge and examples/connector and needs the go command: %w", err)
	}
	// The mains are built in the library's module, not in this one: with the library's
	// go.mod and go.sum, as its users build them, whatever this module requires besides.
	out, err := exec.CommandContext(ctx, goBin, "list", "-m", "-f", "{{.Dir}}", modulePath).Output()
	if err != nil {
		return "", "", fmt.Errorf("go list -m %s (run from Warren's checkout): %w", modulePath, err)
	}
	root := strings.TrimSpace(string(out))
	args := []string{"build", "-o", dir}
	if raceBuilt() {
		args = append(args, "-race")
	}
	args = append(args, "./examples/edge", "./examples/connector")
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go %s (in %s): %w: %s", strings.Join(args, " "), root, err, strings.TrimSpace(string(out)))
	}
	return filepath.Join(dir, "edge"), filepath.Join(dir, "connector"), nil
}

// freePorts returns n distinct loopback ports that were free a moment ago and are none of
// taken (ports handed out before, whose owners may not listen yet); it adds them to taken.
func freePorts(n int, taken map[int]bool) ([]int, error) {
	var out []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		if p := l.Addr().(*net.TCPAddr).Port; !taken[p] {
			taken[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// writeSelfSigned writes a fresh self-signed ECDSA certificate for 127.0.0.1 and localhost
// and its key as PEM files in dir; the certificate is its own CA, so the connectors and the
// TLS relays trust it through ca_path.
func writeSelfSigned(dir string) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "warren bench edge"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}
