// Package connectorcmd is the example connector's daemon and commands: a running
// connector's tunnels by name (Daemon), which SIGHUP reloads from the file; the control
// socket it serves (ListenControl, ControlServer), whose JSON-lines protocol is described
// in control.go; and the commands that talk to it (Status, Attach, Detach). The command's
// main (examples/connector) parses flags, loads the file with package tunnel/config, dials
// the edges and wires these together.
//
// It is internal to the example: the control socket and its protocol are the example
// program's, not the SDK's, whose API (package tunnel) a program embeds instead.
package connectorcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// StartTimeout bounds connecting to the edge and registering a tunnel: at start, on a
// reload, on an attach.
const StartTimeout = 30 * time.Second

// progressEvery is how often a drain in progress counts its streams (Tunnel.ActiveStreams).
const progressEvery = 200 * time.Millisecond

// Daemon is a running connector: its session, its tunnels by name, and the operations the
// control socket and SIGHUP perform on them.
type Daemon struct {
	sess   *tunnel.Session
	log    *zap.Logger
	stdout io.Writer // the tunnel lines
	// line formats a registered tunnel's line (nil: tunnelLine); verify refuses a
	// registration that is not what was asked for (Start.Verify).
	line    func(config.Tunnel, *tunnel.Tunnel) string
	verify  func(config.Tunnel, *tunnel.Tunnel) error
	socket  string
	started time.Time
	ctx     context.Context // ends when the connector stops

	opMu sync.Mutex // one attach, detach or reload at a time

	mu       sync.Mutex
	cfg      *config.Connector // the file as last applied (tunnels that failed to apply left out)
	live     map[string]*entry
	draining map[*entry]bool
	seq      int

	// failed receives a value when a tunnel ended on its own (rejected after a reconnect).
	failed chan struct{}
	wg     sync.WaitGroup // watchers, background drains and reloads
}

// entry is one tunnel of the daemon.
type entry struct {
	name     string
	conf     config.Tunnel
	t        *tunnel.Tunnel
	attached bool // added with attach, not from the file
	seq      int
	retired  atomic.Bool // closed by the daemon: its end is not a failure
}

// NewDaemon returns the daemon of sess, a session with the edges of cfg, listening on the
// control socket at socket ("" for none), printing each tunnel's line to stdout (safe for
// concurrent use) and logging the end of one it did not ask for. ctx ends when the
// connector stops.
func NewDaemon(ctx context.Context, sess *tunnel.Session, cfg *config.Connector, socket string, log *zap.Logger, stdout io.Writer) *Daemon {
	return &Daemon{
		sess: sess, log: log, stdout: stdout, socket: socket, started: time.Now(), ctx: ctx,
		cfg: cfg, live: map[string]*entry{}, draining: map[*entry]bool{}, failed: make(chan struct{}, 1),
	}
}

// Start registers the tunnel t of the file and prints its line. Its error is the edge's
// rejection or the session's end (TunnelError says which).
func (d *Daemon) Start(ctx context.Context, t config.Tunnel) error {
	e, err := d.register(ctx, t, false)
	if err != nil {
		return err
	}
	if d.verify != nil {
		if err := d.verify(t, e.t); err != nil {
			e.retired.Store(true)
			_ = e.t.Close()
			return err
		}
	}
	d.insert(e)
	return nil
}

// Failed receives a value when a tunnel ended on its own (rejected after a reconnect).
func (d *Daemon) Failed() <-chan struct{} { return d.failed }

// ReloadInBackground is SIGHUP: it reads the file again and applies it in the background
// (ReloadFile); Wait waits for it.
func (d *Daemon) ReloadInBackground() { d.wg.Go(func() { _, _ = d.ReloadFile() }) }

// file is the connector's configuration file ("" for a one-liner).
func (d *Daemon) file() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg.File
}

// errReload: a reload that found errors (in the file, or a tunnel the edge refused).
var errReload = errors.New("reload failed")

// ReloadFile reads the connector's file again and applies it, one at a time with attach
// and detach (see reload). It returns the lines it logged; its error is the file's errors
// (nothing changed), or errReload when a change could not be applied.
func (d *Daemon) ReloadFile() ([]string, error) {
	file := d.file()
	next, err := config.LoadConnector(file)
	if err != nil {
		d.log.Error("reload failed; the running configuration is kept", zap.String("file", file))
		for line := range strings.Lines(err.Error()) {
			d.log.Error(strings.TrimRight(line, "\n"))
		}
		return nil, err
	}
	lines, failed := d.reload(next)
	if failed {
		return lines, errReload
	}
	return lines, nil
}

// Wait waits for the watchers, the background drains and the reloads; the session must be
// closed (every tunnel ended) or closing.
func (d *Daemon) Wait() { d.wg.Wait() }

// register registers one tunnel and starts watching it; the caller adds it to live.
func (d *Daemon) register(ctx context.Context, c config.Tunnel, attached bool) (*entry, error) {
	t, err := d.sess.Forward(ctx, c.Spec(), c.LocalAddr())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.seq++
	e := &entry{name: c.Name, conf: c, t: t, attached: attached, seq: d.seq}
	d.mu.Unlock()
	d.wg.Go(func() { d.watch(e) })
	return e, nil
}

// watch waits for e's end; one it did not ask for is reported on stderr.
func (d *Daemon) watch(e *entry) {
	<-e.t.Done()
	if e.retired.Load() {
		return
	}
	d.mu.Lock()
	if d.live[e.name] == e {
		delete(d.live, e.name)
	}
	d.mu.Unlock()
	// When the whole session stopped, its error is reported once, by run.
	if err := e.t.Err(); err != nil && d.sess.Err() == nil {
		d.log.Error(TunnelError(e.name, err), zap.String("tunnel", e.name))
		select {
		case d.failed <- struct{}{}:
		default:
		}
	}
}

// LiveCount is the number of tunnels registered or registering.
func (d *Daemon) LiveCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

// insert makes e the live tunnel of its name and prints its line.
func (d *Daemon) insert(e *entry) {
	d.mu.Lock()
	d.live[e.name] = e
	d.mu.Unlock()
	line := tunnelLine
	if d.line != nil {
		line = d.line
	}
	fmt.Fprintln(d.stdout, line(e.conf, e.t))
}

// drainProgress is told how many streams a drain still waits for.
type drainProgress func(left int)

// retire drains e and returns once it has ended: its streams finished, or ctx ended and cut
// them. progress hears the stream count when it changes.
func (d *Daemon) retire(ctx context.Context, e *entry, progress drainProgress) {
	e.retired.Store(true)
	d.mu.Lock()
	if d.live[e.name] == e {
		delete(d.live, e.name)
	}
	d.draining[e] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.draining, e)
		d.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() { _ = e.t.Shutdown(ctx); close(done) }()
	watchDrain(done, e.t.ActiveStreams, progress)
}

// watchDrain calls progress with count's result at once and whenever it changes, until
// done is closed; then once more with the final count (0 once the streams have ended:
// the last ones may finish a moment after the edge reported the drain done).
func watchDrain(done <-chan struct{}, count func() int, progress drainProgress) {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	last := -1
	report := func(n int) {
		if n != last && progress != nil {
			progress(n)
		}
		last = n
	}
	for {
		report(count())
		select {
		case <-done:
			n := count()
			for end := time.Now().Add(time.Second); n > 0 && time.Now().Before(end); n = count() {
				time.Sleep(10 * time.Millisecond)
			}
			report(n)
			return
		case <-tick.C:
		}
	}
}

// streamsLeft formats a drain's progress for a person.
func streamsLeft(n int) string {
	if n == 1 {
		return "1 stream left"
	}
	return fmt.Sprintf("%d streams left", n)
}

// logDrain is a drainProgress that logs each count of tunnel name's drain.
func (d *Daemon) logDrain(name string) drainProgress {
	return func(n int) {
		d.log.Info(fmt.Sprintf("draining tunnel %s: %s", name, streamsLeft(n)), zap.String("tunnel", name), zap.Int("streams_left", n))
	}
}

// drainTimeout is the bound of one tunnel's drain.
func (d *Daemon) drainTimeout() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg.DrainTimeout
}

// Shutdown drains every tunnel and closes the session, logging the streams left.
func (d *Daemon) Shutdown() {
	d.mu.Lock()
	var all []*entry
	for _, e := range d.live {
		all = append(all, e)
	}
	for e := range d.draining {
		all = append(all, e)
	}
	d.mu.Unlock()
	for _, e := range all {
		e.retired.Store(true)
	}
	done := make(chan struct{})
	go func() { _ = d.sess.Close(); close(done) }()
	watchDrain(done, func() int {
		total := 0
		for _, e := range all {
			total += e.t.ActiveStreams()
		}
		return total
	}, func(n int) {
		d.log.Info("draining: "+streamsLeft(n), zap.Int("streams_left", n))
	})
	d.log.Info("drained; connector stopped")
}

// errNoTunnel is a detach of a name no tunnel has.
var errNoTunnel = errors.New("no such tunnel")

// attach validates c against the tunnels running, registers it and prints its line.
func (d *Daemon) attach(ctx context.Context, c config.Tunnel) (*entry, error) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.mu.Lock()
	_, taken := d.live[c.Name]
	check := &config.Connector{File: "attach", Server: d.cfg.Server, Servers: d.cfg.Servers, DrainTimeout: d.cfg.DrainTimeout}
	for _, e := range d.sorted() {
		check.Tunnels = append(check.Tunnels, e.conf)
	}
	d.mu.Unlock()
	if taken {
		return nil, fmt.Errorf("a tunnel named %q is running; choose another --name", c.Name)
	}
	check.Tunnels = append(check.Tunnels, c)
	if err := check.Validate(); err != nil {
		return nil, err
	}
	e, err := d.register(ctx, c, true)
	if err != nil {
		return nil, errors.New(TunnelError(c.Name, err))
	}
	d.insert(e)
	d.log.Info("tunnel attached", zap.String("tunnel", c.Name), zap.String("url", e.t.URL()))
	return e, nil
}

// detach drains tunnel name and returns once it has ended; progress hears the streams left.
func (d *Daemon) detach(name string, timeout time.Duration, progress drainProgress) (time.Duration, error) {
	d.opMu.Lock()
	d.mu.Lock()
	e := d.live[name]
	d.mu.Unlock()
	if e == nil {
		d.opMu.Unlock()
		return 0, fmt.Errorf("%w %q", errNoTunnel, name)
	}
	e.retired.Store(true) // under opMu: a reload sees it gone
	d.mu.Lock()
	delete(d.live, name)
	d.draining[e] = true
	d.mu.Unlock()
	d.opMu.Unlock()

	if timeout <= 0 {
		timeout = d.drainTimeout()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	d.log.Info("detaching tunnel", zap.String("tunnel", name), zap.Duration("drain_timeout", timeout))
	d.retire(ctx, e, func(n int) {
		d.logDrain(name)(n)
		if progress != nil {
			progress(n)
		}
	})
	took := time.Since(start)
	d.log.Info("tunnel detached", zap.String("tunnel", name), zap.Duration("took", took))
	return took, nil
}

// sorted returns the live tunnels in the order they were added; the caller holds mu.
func (d *Daemon) sorted() []*entry {
	out := make([]*entry, 0, len(d.live))
	for _, e := range d.live {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *entry) int { return a.seq - b.seq })
	return out
}

// status is the daemon's state for `connector status`.
func (d *Daemon) status() StatusReply {
	d.mu.Lock()
	live := d.sorted()
	var draining []*entry
	for e := range d.draining {
		draining = append(draining, e)
	}
	file, servers := d.cfg.File, d.cfg.Servers
	d.mu.Unlock()
	slices.SortFunc(draining, func(a, b *entry) int { return a.seq - b.seq })

	edge, addr := d.sess.Server(), d.sess.ServerAddr()
	if addr == edge {
		addr = ""
	}
	st := StatusReply{PID: os.Getpid(), Config: file, Socket: d.socket, Edge: edge, EdgeAddr: addr, Servers: servers, Proxy: d.sess.Proxy(),
		Transport:  d.sess.Transport(),
		Connected:  d.sess.Connected(),
		Reconnects: d.sess.Reconnects(), Started: d.started.UTC().Truncate(time.Second), Tunnels: []TunnelStatus{}}
	add := func(e *entry, draining bool) {
		ts := TunnelStatus{Name: e.name, Source: "file", Proto: string(e.conf.Proto), URL: e.t.URL(), Port: e.t.Port(),
			Group: e.t.Group(), Local: e.conf.LocalAddr(), ID: e.t.ID()}
		if e.attached {
			ts.Source = "attach"
		}
		if ts.Group == "" {
			ts.Group = e.conf.Group
		}
		switch {
		case draining:
			ts.State = "draining"
		case ts.ID == "":
			ts.State = "reconnecting"
		default:
			ts.State = "registered"
		}
		switch h := e.t.Health(); {
		case !h.Checked:
			ts.Health = "none"
		case ts.ID == "":
			ts.Health = "unknown"
		case !h.Known:
			ts.Health = "starting"
		case h.Healthy:
			ts.Health = "healthy"
		default:
			ts.Health, ts.HealthReason = "unhealthy", h.Reason
		}
		n := e.t.ActiveStreams()
		ts.Streams = &n
		st.Tunnels = append(st.Tunnels, ts)
	}
	for _, e := range live {
		add(e, false)
	}
	for _, e := range draining {
		add(e, true)
	}
	return st
}

// reload applies a new version of the configuration file: tunnels added to it register,
// tunnels removed from it drain, changed ones register anew before the old one drains.
// Settings that need a new session are reported as not applied. It returns the lines
// it logged, and whether any was an error (something it could not apply).
func (d *Daemon) reload(next *config.Connector) (lines []string, failed bool) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	say := func(level func(string, ...zap.Field), msg string, fields ...zap.Field) {
		lines = append(lines, msg)
		if level == nil { // an error: something the file asks for is not applied
			failed, level = true, d.log.Error
		}
		level(msg, fields...)
	}

	d.mu.Lock()
	prev := d.cfg
	live := map[string]*entry{}
	var attachedConfs []config.Tunnel
	for _, e := range d.sorted() {
		live[e.name] = e
		if e.attached {
			attachedConfs = append(attachedConfs, e.conf)
		}
	}
	d.mu.Unlock()

	for _, s := range notAppliedSettings(prev, next) {
		say(d.log.Warn, "not applied: "+s)
	}

	// The file's tunnels and the attached ones must be able to run side by side.
	check := &config.Connector{File: next.File, Server: next.Server, Servers: next.Servers, DrainTimeout: next.DrainTimeout}
	var clash []string
	for _, t := range next.Tunnels {
		if e := live[t.Name]; e != nil && e.attached {
			clash = append(clash, t.Name)
			continue
		}
		check.Tunnels = append(check.Tunnels, t)
	}
	check.Tunnels = append(check.Tunnels, attachedConfs...)
	if err := check.Validate(); err != nil {
		say(nil, "reload refused: the file's tunnels conflict with attached ones: "+err.Error())
		return lines, true
	}
	for _, name := range clash {
		say(d.log.Warn, fmt.Sprintf("not applied: tunnels.%s: an attached tunnel has this name; detach it first", name))
	}

	old := map[string]config.Tunnel{}
	for _, t := range prev.Tunnels {
		old[t.Name] = t
	}
	applied := &config.Connector{}
	*applied = *next
	// Not applied (restartDiff says so): the session keeps its edges, transport, token, TLS settings,
	// drain timeout, data connections' buffer and proxy, and the control socket stays where
	// it is.
	// What runs is kept, so that the next reload compares with it.
	applied.Server, applied.Servers, applied.Transport = prev.Server, prev.Servers, prev.Transport
	applied.AuthToken, applied.TLS, applied.DrainTimeout = prev.AuthToken, prev.TLS, prev.DrainTimeout
	applied.DataReadBuffer, applied.ControlSocket, applied.ProxyURL = prev.DataReadBuffer, prev.ControlSocket, prev.ProxyURL
	applied.Tunnels = nil
	keep := func(t config.Tunnel) { applied.Tunnels = append(applied.Tunnels, t) }

	wanted := map[string]bool{}
	for _, t := range next.Tunnels {
		wanted[t.Name] = true
		if slices.Contains(clash, t.Name) {
			if o, ok := old[t.Name]; ok {
				keep(o)
			}
			continue
		}
		o, existed := old[t.Name]
		e := live[t.Name]
		switch {
		case existed && reflect.DeepEqual(o, t):
			keep(t) // unchanged (and left alone if it was detached)
		case e == nil:
			ctx, cancel := context.WithTimeout(d.ctx, StartTimeout)
			ne, err := d.register(ctx, t, false)
			cancel()
			if err != nil {
				say(nil, "reload: "+TunnelError(t.Name, err))
				if existed {
					keep(o)
				}
				continue
			}
			d.insert(ne)
			say(d.log.Info, "reload: tunnel "+t.Name+" added", zap.String("url", ne.t.URL()))
			keep(t)
		default:
			if d.replace(e, t, say) {
				keep(t)
			} else {
				keep(o)
			}
		}
	}
	for _, o := range prev.Tunnels {
		if wanted[o.Name] {
			continue
		}
		if e := live[o.Name]; e != nil && !e.attached {
			say(d.log.Info, "reload: tunnel "+o.Name+" removed; draining it")
			d.retireInBackground(e)
		}
	}
	d.mu.Lock()
	d.cfg = applied
	d.mu.Unlock()
	say(d.log.Info, "configuration reloaded", zap.String("file", next.File))
	return lines, failed
}

// retireInBackground drains e with the drain timeout, logging its progress.
func (d *Daemon) retireInBackground(e *entry) {
	e.retired.Store(true)
	timeout := d.drainTimeout()
	d.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		d.retire(ctx, e, d.logDrain(e.name))
		d.log.Info("tunnel drained", zap.String("tunnel", e.name))
	})
}

// replace swaps the running tunnel e for a registration of c: the new one registers first
// and, when it has a health check, passes it, then the old one drains, so a pool never
// misses this member. When the edge refuses the new registration because of the old one (a
// solo route held by it, or the session's tunnel limit) the old one drains first. It reports
// whether c now runs.
func (d *Daemon) replace(e *entry, c config.Tunnel, say func(func(string, ...zap.Field), string, ...zap.Field)) bool {
	ctx, cancel := context.WithTimeout(d.ctx, StartTimeout)
	defer cancel()
	ne, err := d.register(ctx, c, false)
	if err == nil {
		if !d.waitHealthy(ctx, ne) {
			say(d.log.Warn, "reload: tunnel "+c.Name+": the new registration has not passed its health check; draining the old one anyway")
		}
		d.insert(ne)
		say(d.log.Info, "reload: tunnel "+c.Name+" changed; registered anew, draining the old registration")
		d.retireInBackground(e)
		return true
	}
	solo := e.conf.Group == "" && sameRoute(e.conf, c)
	if !(errors.Is(err, tunnel.ErrInUse) && solo || errors.Is(err, tunnel.ErrKeyMismatch) && solo || errors.Is(err, tunnel.ErrLimit)) {
		say(nil, "not applied: "+TunnelError(c.Name, err)+"; the running registration is kept")
		return false
	}
	say(d.log.Info, "reload: tunnel "+c.Name+" changed; its route is held by the running registration, which drains first")
	dctx, dcancel := context.WithTimeout(context.Background(), d.drainTimeout())
	d.retire(dctx, e, d.logDrain(c.Name))
	dcancel()
	rctx, rcancel := context.WithTimeout(d.ctx, StartTimeout)
	defer rcancel()
	ne, err = d.register(rctx, c, false)
	if err != nil {
		say(nil, "reload: "+TunnelError(c.Name, err)+" (the old registration is gone)")
		return false
	}
	d.insert(ne)
	say(d.log.Info, "reload: tunnel "+c.Name+" registered anew")
	return true
}

// sameRoute reports whether a and b register the same public route.
func sameRoute(a, b config.Tunnel) bool {
	if a.Proto == tunnel.ProtoTCP || b.Proto == tunnel.ProtoTCP {
		return a.Proto == b.Proto && a.Group != "" && a.Group == b.Group
	}
	return a.Subdomain == b.Subdomain
}

// waitHealthy waits until e's first health report is healthy; a tunnel without a health
// check is healthy at once. It gives up (false) at an unhealthy report or when the first
// probes must have run.
func (d *Daemon) waitHealthy(ctx context.Context, e *entry) bool {
	h := e.conf.HealthCheck
	if h == nil {
		return true
	}
	bound := time.NewTimer(min(2*h.Interval+h.Timeout+time.Second, 2*time.Minute))
	defer bound.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if h := e.t.Health(); h.Known {
			return h.Healthy
		}
		select {
		case <-tick.C:
		case <-bound.C:
			return false
		case <-ctx.Done():
			return false
		case <-e.t.Done():
			return false
		}
	}
}

// notAppliedSettings names the settings of next that differ from prev and need a new
// session (a restart) to apply.
func notAppliedSettings(prev, next *config.Connector) []string {
	var out []string
	if was, now := strings.Join(prev.Edges(), ", "), strings.Join(next.Edges(), ", "); was != now {
		out = append(out, fmt.Sprintf("server (%s -> %s): the connector keeps its session with %s; restart it to move", was, now, was))
	}
	if was, now := transportOf(prev), transportOf(next); was != now {
		out = append(out, fmt.Sprintf("transport (%s -> %s): the session keeps the transport it connected over; restart the connector to change it", was, now))
	}
	if prev.AuthToken != next.AuthToken {
		out = append(out, "auth_token: the session keeps the token it connected with; restart the connector to change it")
	}
	if !reflect.DeepEqual(prev.TLS, next.TLS) {
		out = append(out, "tls: the session keeps its TLS settings; restart the connector to change them")
	}
	if prev.DrainTimeout != next.DrainTimeout {
		out = append(out, fmt.Sprintf("drain_timeout_secs (%s -> %s): restart the connector to change it", prev.DrainTimeout, next.DrainTimeout))
	}
	if prev.DataReadBuffer != next.DataReadBuffer {
		out = append(out, fmt.Sprintf("data_read_buffer (%d -> %d): restart the connector to change it", prev.DataReadBuffer, next.DataReadBuffer))
	}
	if prev.Hostname != next.Hostname {
		out = append(out, fmt.Sprintf("hostname (%q -> %q): the session sends the host name it started with; restart the connector to change it", prev.Hostname, next.Hostname))
	}
	if prev.ProxyURL != next.ProxyURL {
		out = append(out, "proxy_url: the session keeps the proxy it connected through; restart the connector to change it")
	}
	if prev.ControlSocket != next.ControlSocket {
		out = append(out, "control_socket: the connector keeps listening where it started; restart it to move the socket")
	}
	return out
}

// attachTunnel turns an attach request into a tunnel of the file's form, with the
// defaults the file would give it.
func attachTunnel(a *attachSpec) config.Tunnel {
	t := config.Tunnel{Name: a.Name, Proto: tunnel.Proto(a.Proto), LocalHost: a.LocalHost, LocalPort: a.LocalPort,
		Subdomain: a.Subdomain, Group: a.Group, GroupKey: a.GroupKey,
		Weight: a.Weight, Priority: a.Priority, SlowStart: secs(a.SlowStartSecs), Affinity: a.Affinity,
		RetryIdempotent: a.RetryIdempotent}
	if t.Proto == "" {
		t.Proto = tunnel.ProtoHTTP
	}
	if t.LocalHost == "" {
		t.LocalHost = "127.0.0.1"
	}
	if t.Name == "" {
		base := t.Subdomain
		if base == "" {
			base = string(t.Proto)
		}
		t.Name = base + "-" + strconv.Itoa(t.LocalPort)
	}
	if h := a.Health; h != nil {
		hc := &config.HealthCheck{Type: h.Type, Path: h.Path, Interval: health.DefaultInterval, Timeout: health.DefaultTimeout,
			MaxFailed: health.DefaultMaxFailed, Expect2xx: true}
		if h.IntervalSecs > 0 {
			hc.Interval = secs(h.IntervalSecs)
		}
		if h.TimeoutSecs > 0 {
			hc.Timeout = secs(h.TimeoutSecs)
		}
		if h.MaxFailed > 0 {
			hc.MaxFailed = h.MaxFailed
		}
		if h.Expect2xx != nil {
			hc.Expect2xx = *h.Expect2xx
		}
		t.HealthCheck = hc
	}
	return t
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// tunnelLine is the line printed once a tunnel is registered.
func tunnelLine(c config.Tunnel, t *tunnel.Tunnel) string {
	line := fmt.Sprintf("tunnel %s: %s", c.Name, t.URL())
	if t.Port() != 0 {
		line += fmt.Sprintf(" (port %d)", t.Port())
	}
	line += " -> " + c.LocalAddr()
	if g := t.Group(); g != "" {
		line += fmt.Sprintf(" (group %s)", g)
	}
	return line
}

// TunnelError says why the tunnel name failed; a rejection carries the edge's message
// verbatim.
func TunnelError(name string, err error) string {
	if rej, ok := errors.AsType[*tunnel.RejectedError](err); ok {
		return fmt.Sprintf("tunnel %s rejected: %s", name, rej.Message)
	}
	return fmt.Sprintf("tunnel %s: %v", name, err)
}

// transportOf is the transport of c: "" is tcp, the default.
func transportOf(c *config.Connector) string {
	if c.Transport == "" {
		return config.TransportTCP
	}
	return c.Transport
}
