package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startRunArgs is startRun with more flags.
func startRunArgs(t *testing.T, text string, control, http int, args ...string) *runningEdge {
	t.Helper()
	e := &runningEdge{path: filepath.Join(t.TempDir(), "server.toml"), done: make(chan struct{}),
		control: fmt.Sprintf("127.0.0.1:%d", control), public: fmt.Sprintf("127.0.0.1:%d", http)}
	require.NoError(t, os.WriteFile(e.path, []byte(text), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		e.code = run(ctx, func() {}, append([]string{"-config", e.path}, args...), &e.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	return e
}

// sleeper starts a process that sleeps under the program name name (a copy of sleep(1)),
// killed at the end of the test.
func sleeper(t *testing.T, name string) int {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	data, err := os.ReadFile(sleep)
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	cmd := exec.Command(bin, "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// TestPIDFileAndReload: the pid file appears once the edge listens and names it; "edge
// reload" with a broken file sends nothing and exits 1; with a good one it sends SIGHUP,
// which the edge applies; the pid file is gone once the edge exits.
func TestPIDFileAndReload(t *testing.T) {
	control, http1, http2 := freePort(t), freePort(t), freePort(t)
	pidPath := filepath.Join(t.TempDir(), "edge.pid")
	e := startRunArgs(t, edgeFile(control, http1, oldToken, ""), control, http1, "-pid-file", pidPath)
	require.Eventually(t, func() bool { _, err := os.Stat(pidPath); return err == nil }, 10*time.Second, 10*time.Millisecond, e.stderr.String())
	require.Contains(t, e.stderr.String(), `"listener":"control"`, "written once the edge listens")
	data, err := os.ReadFile(pidPath)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(data))

	// A broken file: its errors, exit 1, no signal.
	bad := filepath.Join(t.TempDir(), "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[server]\ndomian = \"x\"\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"reload", "-pid-file", pidPath, "-config", bad}, &stdout, &stderr))
	require.Contains(t, stderr.String(), bad+":2: server.domian: unknown key")
	require.Contains(t, stderr.String(), "nothing was sent")
	require.Empty(t, stdout.String())
	require.NotContains(t, e.stderr.String(), "SIGHUP: reloading")

	// A good one: checked, then the edge (this test binary, edge.test) gets SIGHUP.
	require.NoError(t, os.WriteFile(e.path, []byte(edgeFile(control, http2, newToken, "")), 0o600))
	stderr.Reset()
	require.Equal(t, 0, runWith(context.Background(), func() {}, []string{"reload", "-pid-file", pidPath, "-config", e.path}, &stdout, &stderr), stderr.String())
	require.Equal(t, fmt.Sprintf("sent SIGHUP to edge process %d; its log says what the reload applied\n", os.Getpid()), stdout.String())
	require.Eventually(t, func() bool { return strings.Contains(e.stderr.String(), "configuration reloaded") }, 10*time.Second, 10*time.Millisecond, e.stderr.String())
	require.Contains(t, e.stderr.String(), "applied: auth.tokens and auth.tenants")

	e.cancel()
	<-e.done
	require.Equal(t, 0, e.code)
	_, err = os.Stat(pidPath)
	require.ErrorIs(t, err, os.ErrNotExist, "the pid file is removed on exit")
}

// TestPIDFileRefusesALiveEdge: a pid file naming another live edge stops the start (exit 1,
// no listener); one naming a process that is not an edge, or none, is replaced.
func TestPIDFileRefusesALiveEdge(t *testing.T) {
	control, http := freePort(t), freePort(t)
	pidPath := filepath.Join(t.TempDir(), "edge.pid")
	other := sleeper(t, "edge")
	require.NoError(t, os.WriteFile(pidPath, fmt.Appendf(nil, "%d\n", other), 0o644))
	e := startRunArgs(t, edgeFile(control, http, oldToken, ""), control, http, "-pid-file", pidPath)
	<-e.done
	require.Equal(t, 1, e.code)
	require.Contains(t, e.stderr.String(), fmt.Sprintf("pid file %s: an edge is already running as process %d", pidPath, other))
	data, err := os.ReadFile(pidPath)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%d\n", other), string(data), "left alone")

	notEdge := sleeper(t, "sleepy")
	require.NoError(t, os.WriteFile(pidPath, fmt.Appendf(nil, "%d\n", notEdge), 0o644))
	e = startRunArgs(t, edgeFile(control, http, oldToken, ""), control, http, "-pid-file", pidPath)
	require.Eventually(t, func() bool { return strings.Contains(e.stderr.String(), "pid file written") }, 10*time.Second, 10*time.Millisecond, e.stderr.String())
	require.Contains(t, e.stderr.String(), "it is not an edge")
	data, err = os.ReadFile(pidPath)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(data))
	e.cancel()
	<-e.done
}

// TestReloadErrors: "edge reload" says what is wrong with the pid file and sends nothing.
func TestReloadErrors(t *testing.T) {
	dir := t.TempDir()
	reload := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := runWith(context.Background(), func() {}, append([]string{"reload"}, args...), &stdout, &stderr)
		require.Empty(t, stdout.String())
		return code, stderr.String()
	}
	code, msg := reload()
	require.Equal(t, 2, code)
	require.Contains(t, msg, "usage: edge reload -pid-file PATH")

	missing := filepath.Join(dir, "missing.pid")
	code, msg = reload("-pid-file", missing)
	require.Equal(t, 1, code)
	require.Equal(t, fmt.Sprintf("edge reload: no pid file %s: is the edge running with -pid-file %s?\n", missing, missing), msg)

	garbage := filepath.Join(dir, "garbage.pid")
	require.NoError(t, os.WriteFile(garbage, []byte("hello\n"), 0o644))
	code, msg = reload("-pid-file", garbage)
	require.Equal(t, 1, code)
	require.Contains(t, msg, "does not hold a process id")

	// A process that exited.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	stale := filepath.Join(dir, "stale.pid")
	require.NoError(t, os.WriteFile(stale, fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o644))
	code, msg = reload("-pid-file", stale)
	require.Equal(t, 1, code)
	require.Contains(t, msg, fmt.Sprintf("names process %d, which is not running: a stale pid file", cmd.Process.Pid))

	// A live process that is not an edge is not signalled (it would die of SIGHUP).
	other := sleeper(t, "sleepy")
	notEdge := filepath.Join(dir, "other.pid")
	require.NoError(t, os.WriteFile(notEdge, fmt.Appendf(nil, "%d\n", other), 0o644))
	code, msg = reload("-pid-file", notEdge)
	require.Equal(t, 1, code)
	require.Contains(t, msg, "it is not an edge")
	require.Contains(t, msg, "not signalling it")
}

// TestVersionAndLogFlags: -version (and --version) print the version line; --log-format and
// --log-level shape the one log stream, -v is the console at debug level.
func TestVersionAndLogFlags(t *testing.T) {
	for _, arg := range []string{"-version", "--version"} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, runWith(context.Background(), func() {}, []string{arg}, &stdout, &stderr))
		require.Regexp(t, `^edge \S+ go1\.\S+ rev \S+`, stdout.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[server]\ndomian = \"x\"\n"), 0o600))
	for _, tc := range []struct {
		args []string
		line string
	}{
		{nil, `^\{"level":"error",.*"msg":"` + regexpQuote(bad) + `:2: server.domian: unknown key`},
		{[]string{"--log-format", "console"}, `^\S+\tERROR\t` + regexpQuote(bad) + `:2: server.domian: unknown key`},
		{[]string{"-v"}, `^\S+\tERROR\t` + regexpQuote(bad) + `:2: server.domian: unknown key`},
	} {
		var stderr bytes.Buffer
		require.Equal(t, 2, run(context.Background(), func() {}, append([]string{"-config", bad}, tc.args...), &stderr))
		for l := range strings.Lines(stderr.String()) {
			require.Regexp(t, `^(\{|\S+\t(ERROR|INFO|DEBUG|WARN)\t)`, l, "every line through the logger")
		}
		require.Regexp(t, "(?m)"+tc.line, stderr.String(), "%q", tc.args)
	}
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", bad, "--log-level", "loud"}, &stderr))
	require.Contains(t, stderr.String(), `--log-level "loud": want debug, info, warn or error`)

	// --log-level error leaves out the info lines of a running edge.
	control, http := freePort(t), freePort(t)
	e := startRunArgs(t, edgeFile(control, http, oldToken, ""), control, http, "--log-level", "warn")
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", e.control)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the edge listens")
	e.cancel()
	<-e.done
	require.Equal(t, 0, e.code)
	require.NotContains(t, e.stderr.String(), `"level":"info"`)
}

func regexpQuote(s string) string { return regexp.QuoteMeta(s) }
