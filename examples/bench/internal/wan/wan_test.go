package wan

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// oneWay is the delay of the WAN link the tests build: 50 ms RTT, as in issue 16.
const oneWay = 25 * time.Millisecond

func requireWAN(t *testing.T) {
	t.Helper()
	if err := Check(); err != nil {
		t.Skipf("WAN link simulation unavailable here (needs root, ip, iptables with NFQUEUE): %v", err)
	}
}

func TestDelayRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		port   int
		oneWay time.Duration
		loss   float64
	}{
		{"port 0", 0, oneWay, 0},
		{"port too large", 65536, oneWay, 0},
		{"negative delay", 8080, -time.Millisecond, 0},
		{"negative loss", 8080, oneWay, -0.1},
		{"loss of everything", 8080, oneWay, 1},
		{"NaN loss", 8080, oneWay, nan()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop, err := Delay(ctx, tc.port, tc.oneWay, tc.loss)
			require.Error(t, err)
			require.Nil(t, stop)
			require.NotErrorIs(t, err, ErrNotInNamespace, "input is checked first")
		})
	}
}

func nan() float64 { zero := 0.0; return zero / zero }

func TestDelayRefusedOutsideItsNamespace(t *testing.T) {
	if InNamespace() {
		t.Skip("this process runs inside a wan namespace")
	}
	t.Setenv(EnvNetns, "warren-wan-1-1-deadbeef") // a name alone does not make a namespace ours
	require.False(t, InNamespace())
	stop, err := Delay(context.Background(), 8080, oneWay, 0)
	require.ErrorIs(t, err, ErrNotInNamespace)
	require.Nil(t, stop)
}

func TestRunRefusesEmptyCommand(t *testing.T) {
	require.Error(t, Run(context.Background(), nil, io.Discard, io.Discard))
	require.Error(t, Run(context.Background(), []string{""}, io.Discard, io.Discard))
}

func nsExists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return err == nil
}

func TestRunGivesAProgramANamespaceOfItsOwnAndDeletesIt(t *testing.T) {
	requireWAN(t)
	var out bytes.Buffer
	err := Run(context.Background(), []string{"sh", "-c", `echo "$` + EnvNetns + `"; ` + ipPath() + ` -o link show`}, &out, &out)
	require.NoError(t, err, out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, "the namespace holds lo only: %s", out.String())
	name := lines[0]
	require.True(t, validName(name), name)
	require.Contains(t, lines[1], " lo: ")
	require.Contains(t, lines[1], ",UP,", "lo is up")
	require.False(t, nsExists(name), "namespace %s left behind", name)

	// A failing program: the error comes back and the namespace is gone all the same.
	out.Reset()
	err = Run(context.Background(), []string{"sh", "-c", `echo "$` + EnvNetns + `"; exit 3`}, &out, io.Discard)
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 3, exitErr.ExitCode())
	require.False(t, nsExists(strings.TrimSpace(out.String())))
}

func TestRunStopsTheProgramOnCancelAndDeletesTheNamespace(t *testing.T) {
	requireWAN(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"sh", "-c", `echo "$` + EnvNetns + `"; exec sleep 60`}, pw, io.Discard)
		_ = pw.Close()
	}()
	name, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	name = strings.TrimSpace(name)
	require.True(t, nsExists(name), "namespace %s exists while the program runs", name)
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), cancelGrace, "SIGTERM ended the program")
	case <-time.After(2 * cancelGrace):
		t.Fatal("Run did not return after cancel")
	}
	require.False(t, nsExists(name), "namespace %s left behind", name)
}

// TestWAN runs the link tests inside a namespace of their own: outside one it re-executes
// this test binary through Run and relays its output; inside, it measures.
//
//	go -C examples/bench test -run TestWAN -v ./internal/wan
func TestWAN(t *testing.T) {
	if InNamespace() {
		// Started at real-time priority (below): one P keeps this process to one core,
		// so that it cannot starve the rest of the machine (other test packages in CI).
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
		t.Run("rtt", testRTT)
		t.Run("throughput", testThroughput)
		t.Run("loss", testLoss)
		t.Run("two ports, ctx cancel", testCancel)
		return
	}
	requireWAN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 58*time.Second)
	defer cancel()
	argv := []string{os.Args[0], "-test.run=^TestWAN$", "-test.v", "-test.count=1", "-test.timeout=55s"}
	// The delayer keeps time in this process: at real-time priority it is not delayed by
	// the rest of a loaded machine (see Delay).
	if chrt, err := exec.LookPath("chrt"); err == nil {
		argv = append([]string{chrt, "-f", "10"}, argv...)
	}
	t.Logf("inside a fresh namespace: %s", strings.Join(argv, " "))
	var out bytes.Buffer
	err := Run(ctx, argv, &out, &out)
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		t.Log(line)
	}
	require.NoError(t, err, "the tests inside the namespace failed (output above)")
}

// echoServer accepts connections on a fresh 127.0.0.1 port and echoes what it reads.
func echoServer(t *testing.T) (port int) {
	return server(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// server runs handle for each connection on a fresh 127.0.0.1 port until the test ends.
func server(t *testing.T, handle func(net.Conn)) (port int) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// connectTimes dials the port n times and returns how long each connect took.
func connectTimes(t *testing.T, port, n int) []time.Duration {
	t.Helper()
	addr := net.JoinHostPort("127.0.0.1", itoa(port))
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		require.NoError(t, err)
		out = append(out, time.Since(start))
		require.NoError(t, c.Close())
	}
	slices.Sort(out)
	return out
}

// pingPong measures n round trips of one byte over one connection.
func pingPong(t *testing.T, port, n int) []time.Duration {
	t.Helper()
	c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	buf := []byte{0}
	out := make([]time.Duration, 0, n)
	for i := range n {
		buf[0] = byte(i)
		start := time.Now()
		_, err := c.Write(buf)
		require.NoError(t, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		out = append(out, time.Since(start))
		require.Equal(t, byte(i), buf[0])
	}
	slices.Sort(out)
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }

func median(d []time.Duration) time.Duration { return d[len(d)/2] }

// retransmits reads this namespace's count of retransmitted TCP segments.
func retransmits(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/net/snmp")
	require.NoError(t, err)
	var names []string
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, n := range names {
			if n == "RetransSegs" && i < len(fields) {
				v, err := strconv.ParseInt(fields[i], 10, 64)
				require.NoError(t, err)
				return v
			}
		}
	}
	t.Fatal("no Tcp RetransSegs in /proc/net/snmp")
	return 0
}

func testRTT(t *testing.T) {
	delayed, fast := echoServer(t), echoServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := startDelay(ctx, delayed, oneWay, 0)
	require.NoError(t, err)
	defer func() { _ = d.Stop() }()

	retrans := retransmits(t)
	dc, fc := connectTimes(t, delayed, 5), connectTimes(t, fast, 5)
	dp, fp := pingPong(t, delayed, 10), pingPong(t, fast, 10)
	retrans = retransmits(t) - retrans
	stopErr := d.Stop()
	requireOnlyLate(t, stopErr, "no packet may be lost on an idle link")
	t.Logf("one-way delay %v: TCP connect min/median %v/%v delayed, %v/%v undelayed", oneWay, dc[0], median(dc), fc[0], median(fc))
	t.Logf("one-way delay %v: ping-pong RTT min/median/max %v/%v/%v delayed, %v/%v/%v undelayed (%d packets delayed, released up to %v late, %d TCP retransmissions)",
		oneWay, dp[0], median(dp), dp[len(dp)-1], fp[0], median(fp), fp[len(fp)-1], d.final.Released, d.final.LateMax.Round(time.Microsecond), retrans)
	require.GreaterOrEqual(t, dc[0], 2*oneWay, "a connect over the delayed port costs one RTT")
	require.GreaterOrEqual(t, dp[0], 2*oneWay, "a round trip over the delayed port costs 2*oneWay")
	require.Less(t, median(dp), 3*oneWay, "round trips do not wait much more than the delay")
	require.Less(t, median(fc), oneWay/2, "other ports are not delayed")
	require.Less(t, median(fp), oneWay/2, "other ports are not delayed")

	require.NotContains(t, nfqueueRules(t), "NFQUEUE", "stop removes the rules")
	after := pingPong(t, delayed, 5)
	require.Less(t, median(after), oneWay/2, "after stop the port is fast again")
	require.Equal(t, stopErr, d.Stop(), "stop may be called again")
}

func testThroughput(t *testing.T) {
	const length = 5 * time.Second
	type mark struct {
		at    time.Time
		total int64
	}
	marks := make(chan []mark, 1)
	port := server(t, func(c net.Conn) {
		var ms []mark
		var total int64
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			total += int64(n)
			ms = append(ms, mark{time.Now(), total})
			if err != nil {
				marks <- ms
				return
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := startDelay(ctx, port, oneWay, 0)
	require.NoError(t, err)
	defer func() { _ = d.Stop() }()

	c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)), 5*time.Second)
	require.NoError(t, err)
	buf := make([]byte, 256<<10)
	start := time.Now()
	require.NoError(t, c.SetWriteDeadline(start.Add(length)))
	for {
		if _, err := c.Write(buf); err != nil {
			require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "write: %v", err)
			break
		}
	}
	require.NoError(t, c.Close())
	var ms []mark
	select {
	case ms = <-marks:
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver did not see the end of the stream")
	}
	requireOnlyLate(t, d.Stop(), "the link dropped packets: the queue is too short for one stream")

	// Rate over the whole stream, and from 1 s on (past slow start).
	first, last := ms[0], ms[len(ms)-1]
	var warm mark
	for _, m := range ms {
		if m.at.Sub(start) >= time.Second {
			warm = m
			break
		}
	}
	mib := func(bytes int64, d time.Duration) float64 { return float64(bytes) / (1 << 20) / d.Seconds() }
	require.Positive(t, last.total)
	t.Logf("one plain TCP stream over a %v RTT link: %.1f MiB/s over %v (%.1f MiB/s from 1 s on); %d packets delayed, none dropped, released up to %v late (%d releases > 1 ms late)",
		2*oneWay, mib(last.total, last.at.Sub(first.at)), last.at.Sub(first.at).Round(time.Millisecond),
		mib(last.total-warm.total, last.at.Sub(warm.at)), d.final.Released, d.final.LateMax.Round(time.Microsecond), d.final.Late1ms)
}

func testLoss(t *testing.T) {
	const size = 16 << 20
	got := make(chan uint32, 1)
	port := server(t, func(c net.Conn) {
		h := crc32.NewIEEE()
		_, _ = io.Copy(h, c)
		got <- h.Sum32()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const loss = 0.1
	d, err := startDelay(ctx, port, time.Millisecond, loss)
	require.NoError(t, err)
	defer func() { _ = d.Stop() }()

	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)), 20*time.Second)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, c.SetDeadline(start.Add(30*time.Second)))
	_, err = c.Write(data)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	select {
	case sum := <-got:
		require.Equal(t, crc32.ChecksumIEEE(data), sum, "TCP delivers every byte despite the loss")
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not finish")
	}
	requireOnlyLate(t, d.Stop(), "deliberate loss is not reported as an unwanted drop")
	st := d.final
	share := float64(st.Lost) / float64(st.Seen)
	t.Logf("loss %.0f%%: %d of %d packets dropped (%.1f%%), 16 MiB in %v", loss*100, st.Lost, st.Seen, share*100, time.Since(start).Round(time.Millisecond))
	require.Positive(t, st.Lost)
	require.InDelta(t, loss, share, 0.08)
}

func nfqueueRules(t *testing.T) string {
	t.Helper()
	var all []string
	for _, bin := range iptablesCandidates() {
		rules, err := exec.Command(bin, "-w", "5", "-S", "INPUT").CombinedOutput()
		require.NoError(t, err, string(rules))
		all = append(all, string(rules))
	}
	return strings.Join(all, "\n")
}

func testCancel(t *testing.T) {
	a, b := echoServer(t), echoServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopA, err := Delay(ctx, a, oneWay, 0)
	require.NoError(t, err)
	stopB, err := Delay(ctx, b, 2*oneWay, 0)
	require.NoError(t, err, "a second port gets a queue of its own")
	pa, pb := pingPong(t, a, 3), pingPong(t, b, 3)
	t.Logf("two delayed ports: ping-pong RTT min %v (one-way %v) and %v (one-way %v)", pa[0], oneWay, pb[0], 2*oneWay)
	require.GreaterOrEqual(t, pa[0], 2*oneWay)
	require.Less(t, pa[0], 3*oneWay, "each port has its own delay")
	require.GreaterOrEqual(t, pb[0], 4*oneWay)

	cancel()
	// Cancelling ctx stops both as stop would; nothing to await but the rules going.
	require.Eventually(t, func() bool { return !strings.Contains(nfqueueRules(t), "NFQUEUE") },
		5*time.Second, 10*time.Millisecond, "ctx cancel removes the rules")
	requireOnlyLate(t, stopA(), "stop after cancel")
	requireOnlyLate(t, stopB(), "stop after cancel")
	require.Less(t, median(pingPong(t, a, 5)), oneWay/2, "after cancel the port is fast again")
}

// requireOnlyLate fails unless err is nil or consists of ErrLate reports only (lateness
// depends on the machine's load; it is logged, not failed).
func requireOnlyLate(t *testing.T, err error, msg string) {
	t.Helper()
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		require.ErrorIs(t, e, ErrLate, msg)
	}
	t.Logf("note (machine load): %v", err)
}
