package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// TCP is the public TCP ingress: a listener on each TCP group's port, bound when the group
// is created and closed when it is removed. Each accepted connection goes to one member,
// picked per connection, by the client's address for a group with "client_ip" affinity (a
// failed stream open is retried once on another member); with no selectable member it is
// accepted and closed at once. A connection whose member side is cut before its end (the
// connector's session died, or the tunnel was removed) is reset, so that the client sees
// the loss; a clean end (the backend closed) is a FIN. A connection goes over an idle data
// connection of its member's session when there is one (Tunnel.SetDataConns, datacon.go),
// copied with io.Copy so that Linux splices it, and over a yamux stream otherwise. Wire
// OnCreate and OnRemove into the registry's group.Config; Close stops it, Wait waits for its
// goroutines.
type TCP struct {
	cfg  Config
	done chan struct{} // closed by Close: ends accept back-offs
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	routes map[*group.Group]net.Listener
}

// NewTCP returns the TCP ingress configured by cfg (Registry is not used).
func NewTCP(cfg Config) *TCP {
	cfg.setDefaults()
	return &TCP{cfg: cfg, done: make(chan struct{}), routes: map[*group.Group]net.Listener{}}
}

func (t *TCP) listen(port int) (net.Listener, error) {
	if t.cfg.ListenTCP != nil {
		return t.cfg.ListenTCP(port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(t.cfg.TCPBindHost, fmt.Sprint(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("proxy: %w: %v", group.ErrPortUnavailable, err)
		}
		return nil, err
	}
	return ln, nil
}

// OnCreate binds a new TCP group's port and starts accepting on it; other groups are left
// alone. It is a group.Config.OnCreate and runs under the route's lock. An error wrapping
// group.ErrPortUnavailable means the port is taken; ErrClosed that Close was called.
func (t *TCP) OnCreate(g *group.Group) error {
	if g.Kind != group.KindTCP {
		return nil
	}
	ln, err := t.listen(g.Port)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = ln.Close()
		return ErrClosed
	}
	t.routes[g] = ln
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		t.accept(g, ln)
	}()
	t.cfg.Logger.Info("TCP port opened", zap.Int("port", g.Port), zap.String("group", g.Name))
	return nil
}

// OnRemove closes a removed TCP group's listener, before its port returns to the range. It
// is a group.Config.OnRemove. Connections in flight go on until their tunnel ends.
func (t *TCP) OnRemove(g *group.Group) {
	if g.Kind != group.KindTCP {
		return
	}
	t.mu.Lock()
	ln := t.routes[g]
	delete(t.routes, g)
	t.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
		t.cfg.Logger.Info("TCP port closed", zap.Int("port", g.Port))
	}
}

// Close closes every listener and makes OnCreate fail from now on. Connections in flight
// are left to end with their tunnels. Close is idempotent.
func (t *TCP) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.done)
	}
	for _, ln := range t.routes {
		_ = ln.Close()
	}
}

// Wait waits for every goroutine the ingress started: the accept loops (which end at Close
// or OnRemove) and the connections (which end when the client or the tunnel does).
func (t *TCP) Wait() { t.wg.Wait() }

// accept accepts connections on g's listener until it is closed. A temporary accept error
// is retried after a growing pause, which Close cuts short.
func (t *TCP) accept(g *group.Group, ln net.Listener) {
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if isTemporary(err) && !t.isClosed() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				timer := time.NewTimer(backoff)
				select {
				case <-timer.C:
				case <-t.done:
					timer.Stop()
				}
				continue
			}
			return
		}
		backoff = 0
		t.wg.Go(func() { t.serve(g, c) })
	}
}

func (t *TCP) isClosed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// serve carries one public TCP connection to one member: with "client_ip" affinity, the
// member the client's address hashes to. With no selectable member the connection is
// accepted and closed at once.
func (t *TCP) serve(g *group.Group, c net.Conn) {
	t.cfg.Stats.TCPConnections.Add(1)
	remote := c.RemoteAddr().String()
	if t.cfg.TCPGate != nil {
		if gate := t.cfg.TCPGate(g); gate != nil {
			done, refused := gate.Admit(clientAddr(remote))
			if refused != nil {
				t.cfg.Logger.Debug("TCP connection refused by the endpoint's policy", zap.Int("port", g.Port), zap.String("why", refused.Reason))
				_ = c.Close()
				return
			}
			defer done()
		}
	}
	conn, m, err := connectMemberData(&t.cfg, g, remote)
	if err != nil {
		t.cfg.Logger.Debug("TCP connection refused", zap.Int("port", g.Port), zap.Error(err))
		_ = c.Close()
		return
	}
	defer m.Release()
	tun := m.Value().(*Tunnel)
	if conn.data != nil {
		// Splice: public socket to data socket (datacon.go). A clean end from the connector
		// is believed once its session answers a ping; a connector that died did not.
		JoinData(tun.ctx, c, conn.data, func() bool { _, err := tun.sess.Ping(); return err == nil })
		return
	}
	mux.Join(tun.ctx, c, tun.Joinable(conn.st))
}

// tcpLink is one public TCP connection's way to its member: a data connection of the
// member's session, or else a yamux stream.
type tcpLink struct {
	data net.Conn
	st   mux.Stream
}

// connectMemberData is connectMember for plain TCP groups, which may use data connections:
// for each member it tries an idle data connection of the member's session first, then a
// yamux stream when there is none (or the one taken was dead, or the connector asked for
// streams). A refusal on either goes to one other member, once, as connectMember does.
func connectMemberData(cfg *Config, g *group.Group, remote string) (tcpLink, *group.Member, error) {
	p := &picker{g: g, retries: cfg.Stats.RetriesOpenFailed, outcome: cfg.Outcome}
	if g.Affinity == group.AffinityClientIP {
		if ip := clientAddr(remote); ip.IsValid() {
			p.aff = keyedBy(ip.String())
		}
	}
	l, m, err := pick(p, func(tun *Tunnel) (tcpLink, error) {
		dc, err := tun.openData(remote, cfg.OpenTimeout)
		if err == nil {
			return tcpLink{data: dc}, nil
		}
		if !errors.Is(err, errNoDataConn) {
			return tcpLink{}, err
		}
		st, err := tun.open(context.Background(), remote, cfg.OpenTimeout)
		return tcpLink{st: st}, err
	})
	if err != nil {
		return tcpLink{}, nil, err
	}
	if f := cfg.Outcome; f != nil {
		f(m, false, "") // opened and acknowledged: the member's backend accepted the connection
	}
	return l, m, nil
}

// connectMember opens a data stream for one public connection from remote to one member of
// g (tcp or tls): with "client_ip" affinity, the member the client's address hashes to; a
// failed open is retried once on another member. The member holds an acquired stream slot:
// the caller must Release it.
func connectMember(cfg *Config, g *group.Group, remote string) (mux.Stream, *group.Member, error) {
	p := &picker{g: g, retries: cfg.Stats.RetriesOpenFailed, outcome: cfg.Outcome}
	if g.Affinity == group.AffinityClientIP {
		if ip := clientAddr(remote); ip.IsValid() {
			p.aff = keyedBy(ip.String())
		}
	}
	st, m, err := pick(p, func(tun *Tunnel) (mux.Stream, error) {
		return tun.open(context.Background(), remote, cfg.OpenTimeout)
	})
	if err != nil {
		return nil, nil, err
	}
	if f := cfg.Outcome; f != nil {
		f(m, false, "") // opened and acknowledged: the member's backend accepted the connection
	}
	return st, m, nil
}
