package connectorcmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// The control socket speaks JSON lines. A client connects, writes one request line and reads
// reply lines until one has "type": "result"; the connector then closes the connection.
//
//	→ {"op":"status"}
//	← {"type":"result","ok":true,"status":{...}}
//
//	→ {"op":"attach","tunnel":{"name":"web-8080","proto":"http","local_port":8080,"subdomain":"pool",
//	    "group":"web","group_key":"…","health":{"type":"tcp","interval_secs":5}}}
//	← {"type":"result","ok":true,"message":"tunnel web-8080: http://pool.localhost:8080 -> …","tunnel":{...}}
//
//	→ {"op":"reload"}
//	← {"type":"result","ok":true,"message":"reload: tunnel c added\nconfiguration reloaded"}
//
// reload reads the connector's file again and applies it as SIGHUP does; a file with
// errors is {"ok":false,"error":"<the file's errors>"} and changes nothing; a change the
// edge refused is {"ok":false,"error":"<every line of the reload>"}.
//
//	→ {"op":"detach","name":"web-8080","timeout_secs":30}
//	← {"type":"progress","message":"draining web-8080: 2 streams left","streams":2}
//	← {"type":"progress","message":"draining web-8080: 1 stream left","streams":1}
//	← {"type":"progress","message":"draining web-8080: 0 streams left","streams":0}
//	← {"type":"result","ok":true,"message":"tunnel web-8080 detached (drained in 1.2s)"}
//
// A failure is {"type":"result","ok":false,"error":"…"}. "streams" is the tunnel's open
// streams (tunnel.Tunnel.ActiveStreams), exact on every system; connectors before it
// counted TCP connections in /proc and left it out where they could not. Unknown request
// fields are ignored; an unknown op is an error.

// request is the one line a client sends.
type request struct {
	// Op is "status", "attach", "detach" or "reload".
	Op string `json:"op"`
	// Tunnel is the tunnel to attach.
	Tunnel *attachSpec `json:"tunnel,omitempty"`
	// Name is the tunnel to detach; TimeoutSecs bounds its drain (0: drain_timeout_secs).
	Name        string  `json:"name,omitempty"`
	TimeoutSecs float64 `json:"timeout_secs,omitempty"`
}

// attachSpec is a tunnel to attach, with the keys of the configuration file's tunnels.
type attachSpec struct {
	Name      string      `json:"name,omitempty"` // default <subdomain or proto>-<local_port>
	Proto     string      `json:"proto,omitempty"`
	LocalHost string      `json:"local_host,omitempty"`
	LocalPort int         `json:"local_port"`
	Subdomain string      `json:"subdomain,omitempty"`
	Group     string      `json:"group,omitempty"`
	GroupKey  string      `json:"group_key,omitempty"`
	Health    *healthSpec `json:"health,omitempty"`
	// Load-balancing settings, as in the file.
	Weight          int     `json:"weight,omitempty"`
	Priority        int     `json:"priority,omitempty"`
	SlowStartSecs   float64 `json:"slow_start_secs,omitempty"`
	Affinity        string  `json:"affinity,omitempty"`
	RetryIdempotent bool    `json:"retry_idempotent,omitempty"`
}

// healthSpec is an attached tunnel's health check; zero values take the file's defaults.
type healthSpec struct {
	Type         string  `json:"type"`
	Path         string  `json:"path,omitempty"`
	IntervalSecs float64 `json:"interval_secs,omitempty"`
	TimeoutSecs  float64 `json:"timeout_secs,omitempty"`
	MaxFailed    int     `json:"max_failed,omitempty"`
	Expect2xx    *bool   `json:"expect_2xx,omitempty"`
}

// reply is one line the connector answers.
type reply struct {
	Type    string        `json:"type"` // "progress" or "result"
	OK      bool          `json:"ok,omitempty"`
	Error   string        `json:"error,omitempty"`
	Message string        `json:"message,omitempty"`
	Streams *int          `json:"streams,omitempty"`
	Status  *StatusReply  `json:"status,omitempty"`
	Tunnel  *TunnelStatus `json:"tunnel,omitempty"`
}

// StatusReply is the connector's state.
type StatusReply struct {
	PID        int            `json:"pid"`
	Config     string         `json:"config"`
	Socket     string         `json:"socket"`
	Edge       string         `json:"edge"`                // the edge attached to (or last attached to), as configured
	EdgeAddr   string         `json:"edge_addr,omitempty"` // the address Edge's host name resolved to, when it did
	Servers    []string       `json:"servers,omitempty"`   // the servers of the file, when it lists several
	Proxy      string         `json:"proxy,omitempty"`     // the proxy Edge is reached through (scheme://host:port, no credentials)
	Transport  string         `json:"transport"`           // how the session reaches Edge: "tcp", "websocket" or "quic"
	Connected  bool           `json:"connected"`
	Reconnects int            `json:"reconnects"`
	Started    time.Time      `json:"started"`
	Tunnels    []TunnelStatus `json:"tunnels"`
}

// TunnelStatus is one tunnel's state.
type TunnelStatus struct {
	Name   string `json:"name"`
	Source string `json:"source"` // "file" or "attach"
	State  string `json:"state"`  // "registered", "reconnecting" or "draining"
	Proto  string `json:"proto"`
	URL    string `json:"url"`
	Port   int    `json:"port,omitempty"`
	Group  string `json:"group,omitempty"`
	Local  string `json:"local"`
	// Health is "healthy", "unhealthy", "starting" (no probe result yet: the edge sends it
	// nothing), "none" (no health check: always selectable) or "unknown" (not registered).
	Health       string `json:"health"`
	HealthReason string `json:"health_reason,omitempty"`
	// Streams is the number of open streams (idle keep-alive ones included), from
	// tunnel.Tunnel.ActiveStreams. It is always set; a pointer because connectors before
	// that API sent null where they could not count (the table shows "?" for it).
	Streams *int   `json:"streams"`
	ID      string `json:"id,omitempty"`
}

// maxRequestLine bounds a request line.
const maxRequestLine = 1 << 20

// ErrAlreadyRunning: another connector answers on the socket path.
var ErrAlreadyRunning = errors.New("another connector is already running")

// ListenControl listens on the Unix socket at path with permissions mode. A connector
// answering there already is an error; a socket file nobody answers on (left by a connector
// that was killed) is removed. The socket is created under a temporary name, given its
// mode and renamed into place, so it is never reachable with wider permissions.
func ListenControl(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if len(path) > config.MaxSocketPathLen {
		return nil, fmt.Errorf("control socket %s: the path is %d bytes long; a Unix socket path has at most %d (use --socket)", path, len(path), config.MaxSocketPathLen)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("control socket %s: the path exists and is not a socket; not removing it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w with control socket %s (stop it, or give this one another --socket)", ErrAlreadyRunning, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("control socket %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("control socket %s: removing the stale socket: %w", path, err)
		}
	}
	tmp := filepath.Join(dir, ".wc"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	if len(tmp) > config.MaxSocketPathLen {
		tmp = path // no room for a temporary name: the mode is set right after listening
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		_ = l.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if tmp != path {
		if err := os.Rename(tmp, path); err != nil {
			return fail(err)
		}
	}
	return l, nil
}

// ControlServer serves the control socket of a Daemon.
type ControlServer struct {
	d    *Daemon
	l    *net.UnixListener
	path string
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// NewControlServer returns the server of l; l nil (no control socket) makes one that
// serves nothing.
func NewControlServer(d *Daemon, l *net.UnixListener, path string) *ControlServer {
	return &ControlServer{d: d, l: l, path: path, conns: map[net.Conn]bool{}}
}

// Start serves clients until Close.
func (s *ControlServer) Start() {
	if s.l != nil {
		s.wg.Go(s.serve)
	}
}

// serve accepts clients until close.
func (s *ControlServer) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			s.handle(c)
		})
	}
}

// Close stops accepting, removes the socket file and waits for the clients being served;
// without wait it ends the ones that wait (a detach) first.
func (s *ControlServer) Close(wait bool) {
	if s.l == nil {
		return
	}
	_ = s.l.Close()
	_ = os.Remove(s.path)
	if !wait {
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
	}
	s.wg.Wait()
}

// handle serves one client: one request, replies until the result.
func (s *ControlServer) handle(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReaderSize(&limitedReader{c: c, n: maxRequestLine}, 64<<10).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	enc := json.NewEncoder(c)
	var wmu sync.Mutex
	send := func(r reply) {
		wmu.Lock()
		defer wmu.Unlock()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = enc.Encode(r) // a client that left does not stop the operation
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		send(reply{Type: "result", Error: "bad request: " + err.Error()})
		return
	}
	switch req.Op {
	case "status":
		st := s.d.status()
		send(reply{Type: "result", OK: true, Status: &st})
	case "attach":
		if req.Tunnel == nil {
			send(reply{Type: "result", Error: "bad request: attach needs a tunnel"})
			return
		}
		ctx, cancel := context.WithTimeout(s.d.ctx, StartTimeout)
		defer cancel()
		e, err := s.d.attach(ctx, attachTunnel(req.Tunnel))
		if err != nil {
			send(reply{Type: "result", Error: err.Error()})
			return
		}
		st := s.d.status()
		r := reply{Type: "result", OK: true, Message: tunnelLine(e.conf, e.t)}
		for i := range st.Tunnels {
			if st.Tunnels[i].Name == e.name && st.Tunnels[i].State != "draining" {
				r.Tunnel = &st.Tunnels[i]
			}
		}
		send(r)
	case "detach":
		if req.Name == "" {
			send(reply{Type: "result", Error: "bad request: detach needs a name"})
			return
		}
		took, err := s.d.detach(req.Name, secs(req.TimeoutSecs), func(n int) {
			send(reply{Type: "progress", Message: "draining " + req.Name + ": " + streamsLeft(n), Streams: &n})
		})
		if err != nil {
			send(reply{Type: "result", Error: err.Error()})
			return
		}
		send(reply{Type: "result", OK: true, Message: fmt.Sprintf("tunnel %s detached (drained in %s)", req.Name, took.Round(10*time.Millisecond))})
	case "reload":
		file := s.d.file()
		if file == "" {
			send(reply{Type: "result", Error: "this connector runs without a configuration file: nothing to reload"})
			return
		}
		s.d.log.Info("control: reloading the configuration", zap.String("file", file))
		lines, err := s.d.ReloadFile()
		switch {
		case errors.Is(err, errReload):
			send(reply{Type: "result", Error: strings.Join(lines, "\n")})
		case err != nil:
			send(reply{Type: "result", Error: err.Error()})
		default:
			send(reply{Type: "result", OK: true, Message: strings.Join(lines, "\n")})
		}
	default:
		s.d.log.Debug("control: unknown op", zap.String("op", req.Op))
		send(reply{Type: "result", Error: fmt.Sprintf("unknown op %q (want status, attach, detach or reload)", req.Op)})
	}
}

// limitedReader reads at most n bytes from c.
type limitedReader struct {
	c net.Conn
	n int
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("request line too long")
	}
	if len(p) > r.n {
		p = p[:r.n]
	}
	n, err := r.c.Read(p)
	r.n -= n
	return n, err
}
