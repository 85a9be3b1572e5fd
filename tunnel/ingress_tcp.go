package tunnel

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// tcpRoute is the public listener of one TCP group.
type tcpRoute struct {
	g  *group.Group
	ln net.Listener
}

func (s *Server) listenTCP(port int) (net.Listener, error) {
	if s.cfg.ListenTCP != nil {
		return s.cfg.ListenTCP(port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.TCPBindHost, fmt.Sprint(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%w: %v", group.ErrPortUnavailable, err)
		}
		return nil, err
	}
	return ln, nil
}

// onGroupCreate binds a new TCP group's port; it runs under the route's lock.
func (s *Server) onGroupCreate(g *group.Group) error {
	if g.Kind != group.KindTCP {
		return nil
	}
	ln, err := s.listenTCP(g.Port)
	if err != nil {
		return err
	}
	r := &tcpRoute{g: g, ln: ln}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.tcpRoutes[g] = r
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.acceptTCP(r)
	}()
	s.log.Info("TCP port opened", zap.Int("port", g.Port), zap.String("group", g.Name))
	return nil
}

// onGroupRemove closes a removed TCP group's listener before its port returns to the range.
func (s *Server) onGroupRemove(g *group.Group) {
	if g.Kind != group.KindTCP {
		return
	}
	s.mu.Lock()
	r := s.tcpRoutes[g]
	delete(s.tcpRoutes, g)
	s.mu.Unlock()
	if r != nil {
		_ = r.ln.Close()
		s.log.Info("TCP port closed", zap.Int("port", g.Port))
	}
}

func (s *Server) closeTCPListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.tcpRoutes {
		_ = r.ln.Close()
	}
}

func (s *Server) acceptTCP(r *tcpRoute) {
	var backoff time.Duration
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if isTemporary(err) && !s.shuttingDown() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.done:
					t.Stop()
				}
				continue
			}
			return
		}
		backoff = 0
		s.wg.Go(func() { s.serveTCP(r.g, c) })
	}
}

// serveTCP carries one public TCP connection to one member. With no selectable member the
// connection is accepted and closed at once.
func (s *Server) serveTCP(g *group.Group, c net.Conn) {
	s.requests.tcp.Add(1)
	st, m, err := s.dialGroup(g, c.RemoteAddr().String())
	if err != nil {
		s.log.Debug("TCP connection refused", zap.Int("port", g.Port), zap.Error(err))
		_ = c.Close()
		return
	}
	defer m.Release()
	join(m.Value.(*edgeTunnel).ctx, c, st)
}
