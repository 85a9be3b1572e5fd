package connectorcmd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warren-tunnel/warren/examples/internal/cli"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// QuickUsage is the usage of the one-liners.
const QuickUsage = `       connector http PORT --server HOST:PORT [--token-file F] [--subdomain S] [--group G --key-file K] [--health-path /p]
       connector tcp PORT --server HOST:PORT [--token-file F] [--remote-port P] [--group G --key-file K]`

// Quick is `connector http ARGS` and `connector tcp ARGS` (proto "http" or "tcp"): one
// tunnel to the local service PORT (127.0.0.1:PORT, or HOST:PORT) with no configuration
// file. It prints the public URL alone on one line of stdout, runs until ctx ends, then
// drains. It returns the exit code.
func Quick(ctx context.Context, proto string, args []string, stdout, stderr io.Writer, terminal bool) int {
	line := "connector " + proto + " PORT --server HOST:PORT [flags]"
	fs := newFlagSet(proto, line, stderr)
	server := fs.String("server", "", "the edge's control `address`, host:port (required)")
	tokenFile := fs.String("token-file", "", "`file` holding the connector token (kept off the command line)")
	group := fs.String("group", "", "join the pool `name`d so; needs --key-file")
	keyFile := fs.String("key-file", "", "`file` holding the pool's group key")
	failFast := fs.Bool("fail-fast", false, "exit 1 at the first failed dial of the edge instead of retrying until it answers")
	drain := fs.Float64("drain-timeout", tunnel.DefaultDrainTimeout.Seconds(), "`seconds` open streams may run after Ctrl-C")
	var subdomain, healthPath *string
	var remotePort *int
	if proto == "http" {
		subdomain = fs.String("subdomain", "", "public `subdomain` (default: a random one, e.g. q-1a2b3c4d)")
		healthPath = fs.String("health-path", "", "`path` an HTTP health check GETs every 10 s; the tunnel takes traffic only while it answers 2xx")
	} else {
		remotePort = fs.Int("remote-port", 0, "the public `port` the edge must give the tunnel (one reserved for it, or its pool's); another is refused, exit 1")
	}
	var lf cli.LogFlags
	lf.Register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "connector %s: "+format+"\n", append([]any{proto}, a...)...)
		return 2
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	if *server == "" {
		return usageErr("--server HOST:PORT is required: the edge's control address")
	}
	host, port, err := localTarget(pos[0])
	if err != nil {
		return usageErr("%v", err)
	}
	t := config.Tunnel{Proto: tunnel.Proto(proto), LocalHost: host, LocalPort: port, Group: *group}
	t.Name = fmt.Sprintf("%s-%d", proto, port)
	if (*group == "") != (*keyFile == "") {
		return usageErr("--group and --key-file go together")
	}
	if *keyFile != "" {
		if t.GroupKey, err = readSecret(*keyFile); err != nil {
			return usageErr("--key-file: %v", err)
		}
	}
	cfg := &config.Connector{File: "", Server: *server, DrainTimeout: tunnel.DefaultDrainTimeout}
	if *drain > 0 {
		cfg.DrainTimeout = secs(*drain)
	}
	if *tokenFile != "" {
		if cfg.AuthToken, err = readSecret(*tokenFile); err != nil {
			return usageErr("--token-file: %v", err)
		}
	}
	if proto == "http" {
		t.Subdomain = *subdomain
		if t.Subdomain == "" {
			t.Subdomain = randomSubdomain()
		}
		if *healthPath != "" {
			t.HealthCheck = &config.HealthCheck{Type: "http", Path: *healthPath, Interval: health.DefaultInterval,
				Timeout: health.DefaultTimeout, MaxFailed: health.DefaultMaxFailed, Expect2xx: true}
		}
	}
	cfg.Tunnels = []config.Tunnel{t}
	if err := cfg.Validate(); err != nil {
		return usageErr("%v", strings.TrimPrefix(err.Error(), ": "))
	}
	opts, err := cfg.DialOptions()
	if err != nil {
		return usageErr("%v", err)
	}
	log, err := lf.Logger(stderr, terminal)
	if err != nil {
		return usageErr("%v", err)
	}
	defer func() { _ = log.Sync() }()
	want := 0
	if remotePort != nil {
		want = *remotePort
	}
	return Run(ctx, Start{Cfg: cfg, Opts: opts, NoSocket: true, FailFast: *failFast, Log: log, Stdout: stdout,
		Line: func(_ config.Tunnel, tt *tunnel.Tunnel) string { return tt.URL() },
		Verify: func(_ config.Tunnel, tt *tunnel.Tunnel) error {
			if want != 0 && tt.Port() != want {
				return fmt.Errorf("the edge gave this tunnel port %d, not --remote-port %d: a fixed port is one the edge reserves "+
					"for a pool ([[endpoints]] with port = %d and its group), or the port the pool already has", tt.Port(), want, want)
			}
			return nil
		}})
}

// localTarget parses the one-liner's PORT argument: a port of 127.0.0.1, or HOST:PORT.
func localTarget(arg string) (string, int, error) {
	host, portStr := "127.0.0.1", arg
	if strings.Contains(arg, ":") {
		h, p, err := net.SplitHostPort(arg)
		if err != nil {
			return "", 0, fmt.Errorf("%q is not a local port or HOST:PORT: %v", arg, err)
		}
		host, portStr = h, p
		if host == "" {
			host = "127.0.0.1"
		}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q is not a local port (1-65535) or HOST:PORT", arg)
	}
	return host, port, nil
}

// readSecret reads a token or key from a file, without its trailing newline.
func readSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(data), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// randomSubdomain is the default subdomain of `connector http`, as ngrok and cloudflared
// quick tunnels have one: q- and 8 random hex digits.
func randomSubdomain() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "q-" + hex.EncodeToString(b)
}
