package connectorcmd

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// clientFlags are the flags every control command takes: where the socket is.
type clientFlags struct {
	socket, config string
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.socket, "socket", "", "the running connector's control socket `path` (default: the one of --config)")
	fs.StringVar(&c.config, "config", "", "the running connector's configuration `file`: its control_socket, or the default socket of that file (default ~/.warren/config.yml)")
}

// socketPath resolves the control socket as start does: --socket, else control_socket of
// --config (or of the default file), else the default socket of that file. It reads only
// the control_socket key of the file (config.ConnectorControlSocket): a file with errors
// elsewhere still leads to the running connector, which keeps the configuration it loaded.
func (c *clientFlags) socketPath() (string, error) {
	if c.socket != "" {
		return c.socket, nil
	}
	path, explicit := c.config, c.config != ""
	if !explicit {
		p, err := config.DefaultConnectorPath()
		if err != nil {
			return "", err
		}
		path = p
	}
	socket, err := config.ConnectorControlSocket(path)
	switch {
	case err == nil && socket != "":
		return socket, nil
	case err != nil && explicit:
		return "", err
	}
	return DefaultControlSocket(path)
}

// fileWarning returns a warning when the connector file at path, which a running connector
// was started with, does not load now, or "".
func fileWarning(path string) string {
	if path == "" {
		return ""
	}
	if _, err := config.LoadConnector(path); err != nil {
		return fmt.Sprintf("connector: warning: %s has errors; the running connector keeps the configuration it loaded (fix the file, then \"connector reload\"):\n%v", path, err)
	}
	return ""
}

// newFlagSet returns a flag set for a control command whose usage is line.
func newFlagSet(name, line string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: "+line)
		fs.PrintDefaults()
	}
	return fs
}

// parseInterleaved parses flags given before, between and after the positional arguments,
// and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// call sends req to the connector at socket and returns its result; progress lines go to
// progress.
func call(socket string, req request, progress func(reply)) (reply, error) {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return reply{}, fmt.Errorf("no connector is running with control socket %s (start one with \"connector start\", or pass --socket)", socket)
		}
		return reply{}, fmt.Errorf("control socket %s: %w", socket, err)
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return reply{}, fmt.Errorf("control socket %s: %w", socket, err)
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return reply{}, fmt.Errorf("control socket %s: bad reply: %w", socket, err)
		}
		if r.Type == "result" {
			if !r.OK {
				return r, errors.New(r.Error)
			}
			return r, nil
		}
		if progress != nil {
			progress(r)
		}
	}
	if err := sc.Err(); err != nil {
		return reply{}, fmt.Errorf("control socket %s: %w", socket, err)
	}
	return reply{}, fmt.Errorf("control socket %s: the connector closed the connection without an answer (it is stopping?)", socket)
}

// Status is `connector status ARGS`; it returns the exit code.
func Status(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", "connector status [--json] [--socket PATH]", stderr)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the status as JSON, for scripts")
	r, code, ok := askRunning(fs, &cf, args, "status", stderr)
	if !ok {
		return code
	}
	if w := fileWarning(r.Status.Config); w != "" {
		fmt.Fprintln(stderr, w)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r.Status)
		return 0
	}
	printStatus(stdout, r.Status)
	return 0
}

// askRunning parses a client subcommand's args with fs, finds the running connector's control
// socket and sends it the request op. Without ok, the subcommand exits with code: 2 for bad
// arguments or no socket to find, 1 when the connector did not answer.
func askRunning(fs *flag.FlagSet, cf *clientFlags, args []string, op string, stderr io.Writer) (r reply, code int, ok bool) {
	if code, ok := parseOrExit(fs, args, 0); !ok {
		return reply{}, code, false
	}
	socket, err := cf.socketPath()
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return reply{}, 2, false
	}
	if r, err = call(socket, request{Op: op}, nil); err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return reply{}, 1, false
	}
	return r, 0, true
}

// Reload is `connector reload ARGS`: the running connector reads its file again and
// applies it, as SIGHUP does; it prints what the reload applied, or the file's errors (exit
// 1, nothing changed), and exits 1 when the edge refused a change.
func Reload(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("reload", "connector reload [--config FILE] [--socket PATH]", stderr)
	var cf clientFlags
	cf.register(fs)
	r, code, ok := askRunning(fs, &cf, args, "reload", stderr)
	if !ok {
		return code
	}
	fmt.Fprintln(stdout, r.Message)
	return 0
}

// printStatus writes st as a table for people.
func printStatus(w io.Writer, st *StatusReply) {
	conn := "connected"
	if !st.Connected {
		conn = "reconnecting"
	}
	edge := st.Edge
	if st.EdgeAddr != "" {
		edge += " [" + st.EdgeAddr + "]"
	}
	fmt.Fprintf(w, "edge:       %s (%s, %d reconnects)\n", edge, conn, st.Reconnects)
	if len(st.Servers) > 0 {
		fmt.Fprintf(w, "servers:    %s\n", strings.Join(st.Servers, ", "))
	}
	if st.Proxy != "" {
		fmt.Fprintf(w, "proxy:      %s\n", st.Proxy)
	}
	if st.Transport != "" {
		fmt.Fprintf(w, "transport:  %s\n", st.Transport)
	}
	fmt.Fprintf(w, "connector:  pid %d, up since %s, config %s\n", st.PID, st.Started.Local().Format(time.DateTime), st.Config)
	fmt.Fprintf(w, "socket:     %s\n\n", st.Socket)
	if len(st.Tunnels) == 0 {
		fmt.Fprintln(w, "no tunnels (add one with \"connector attach\")")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tURL\tGROUP\tLOCAL\tHEALTH\tSTREAMS\tSOURCE")
	for _, t := range st.Tunnels {
		streams := "?"
		if t.Streams != nil {
			streams = strconv.Itoa(*t.Streams)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.State, orDash(t.URL), orDash(t.Group), t.Local, t.Health, streams, t.Source)
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseOrExit parses fs and checks that exactly want positional arguments remain (-1: any).
// ok false means: return code.
func parseOrExit(fs *flag.FlagSet, args []string, want int) (code int, ok bool) {
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if want >= 0 && len(pos) != want {
		fs.Usage()
		return 2, false
	}
	return 0, true
}

// Attach is `connector attach ARGS`; it returns the exit code.
func Attach(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("attach", "connector attach [--name NAME] [--proto http|https|tcp|tls] [--subdomain SUB] [--group G --group-key-file FILE] [--health tcp|http ...] [--local-host HOST] PORT", stderr)
	var cf clientFlags
	cf.register(fs)
	var a attachSpec
	fs.StringVar(&a.Name, "name", "", "the tunnel's `name` (default <subdomain or proto>-<PORT>)")
	fs.StringVar(&a.Proto, "proto", "http", "`protocol`: http, https, tcp or tls (TLS passthrough)")
	fs.StringVar(&a.Subdomain, "subdomain", "", "public `subdomain` (http, https, tls)")
	fs.StringVar(&a.LocalHost, "local-host", "127.0.0.1", "`host` of the local service")
	fs.StringVar(&a.Group, "group", "", "the pool's `name`; needs --group-key-file")
	keyFile := fs.String("group-key-file", "", "`file` holding the pool's group key (kept off the command line)")
	health := fs.String("health", "", "health check `type`: tcp or http (default none: always healthy)")
	var h healthSpec
	fs.StringVar(&h.Path, "health-path", "", "`path` an http health check GETs")
	fs.Float64Var(&h.IntervalSecs, "health-interval", 0, "`seconds` between probes (default 10)")
	fs.Float64Var(&h.TimeoutSecs, "health-timeout", 0, "`seconds` a probe may take (default 3)")
	fs.IntVar(&h.MaxFailed, "health-max-failed", 0, "consecutive failures before unhealthy (default 3)")
	anyStatus := fs.Bool("health-any-status", false, "an http probe passes on any status, not only 2xx")
	fs.IntVar(&a.Weight, "weight", 0, "share of new work relative to the pool's tier, 1-100 (default 1)")
	fs.IntVar(&a.Priority, "priority", 0, "priority `tier`, 0 first (default 0)")
	fs.Float64Var(&a.SlowStartSecs, "slow-start", 0, "ramp up over this many `seconds` after turning healthy (default 0)")
	fs.StringVar(&a.Affinity, "affinity", "", "the pool's `affinity`: cookie, client_ip or header:<Name>")
	fs.BoolVar(&a.RetryIdempotent, "retry-idempotent", false, "the pool's opt-in idempotent retry")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	port, err := strconv.Atoi(pos[0])
	if err != nil || port < 1 || port > 65535 {
		fmt.Fprintf(stderr, "connector: %q is not a local port (1-65535)\n", pos[0])
		return 2
	}
	a.LocalPort = port
	if *keyFile != "" {
		key, err := os.ReadFile(*keyFile)
		if err != nil {
			fmt.Fprintln(stderr, "connector: --group-key-file:", err)
			return 2
		}
		a.GroupKey = strings.TrimRight(string(key), "\r\n")
		if a.GroupKey == "" {
			fmt.Fprintf(stderr, "connector: --group-key-file: %s is empty\n", *keyFile)
			return 2
		}
	}
	if *health != "" {
		h.Type = *health
		if *anyStatus {
			f := false
			h.Expect2xx = &f
		}
		a.Health = &h
	}
	socket, err := cf.socketPath()
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 2
	}
	r, err := call(socket, request{Op: "attach", Tunnel: &a}, nil)
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 1
	}
	fmt.Fprintln(stdout, r.Message)
	return 0
}

// Detach is `connector detach ARGS`; it returns the exit code.
func Detach(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("detach", "connector detach [--timeout SECS] [--socket PATH] NAME", stderr)
	var cf clientFlags
	cf.register(fs)
	timeout := fs.Float64("timeout", 0, "bound the drain to `seconds`; streams still open then are cut (default drain_timeout_secs)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	socket, err := cf.socketPath()
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 2
	}
	r, err := call(socket, request{Op: "detach", Name: pos[0], TimeoutSecs: *timeout}, func(p reply) {
		fmt.Fprintln(stdout, p.Message)
	})
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 1
	}
	fmt.Fprintln(stdout, r.Message)
	return 0
}
