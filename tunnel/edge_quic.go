package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
)

// Connectors over QUIC (ServerConfig.QUICAddr, ServeQUIC, WithQUIC).
//
// The transport itself is package tunnel/quic, which registers itself when a program imports
// it: a program that does not ask for QUIC (a connector-only binary above all) does not link
// quic-go. Here is what every transport shares: the session (edge_session.go) runs over the
// QUIC connection as over yamux, each dispatched request or connection on a stream of its
// own, and a session over QUIC opens no data connections.

// TransportQUIC is a QUIC connection to the edge's UDP port (ServerConfig.QUICAddr,
// WithQUIC).
const TransportQUIC = "quic"

// quicImport is the import that links the QUIC transport in.
const quicImport = `import _ "github.com/warren-tunnel/warren/tunnel/quic"`

// errQUICNotLinked is the failure of asking for QUIC in a program that does not link it.
var errQUICNotLinked = fmt.Errorf("tunnel: QUIC is not linked into this program: add %s: %w", quicImport, ErrInvalid)

// quicTransport returns the registered QUIC transport, or errQUICNotLinked.
func quicTransport() (mux.QUIC, error) {
	if q := mux.RegisteredQUIC(); q != nil {
		return q, nil
	}
	return nil, errQUICNotLinked
}

// validateQUIC checks QUICAddr (ServerConfig.Validate): QUIC needs the QUIC transport linked
// in. (It needs TLSConfig too, which ListenAndServe checks: a configuration may be validated
// before its certificate is loaded.)
func (c ServerConfig) validateQUIC() []error {
	if c.QUICAddr != "" && mux.RegisteredQUIC() == nil {
		return []error{fieldErr("QUICAddr", "needs the QUIC transport linked in: add %s to the program", quicImport)}
	}
	return nil
}

// ServeQUIC accepts connectors over QUIC on pc, a UDP socket, until Shutdown or Close, and
// always returns a non-nil error: ErrServerClosed after those. The edge presents its
// ServerConfig.TLSConfig certificate (TLS 1.3, the ALPN of package tunnel/quic), which must
// be set, and the program must import package tunnel/quic (else the error says so). ServeQUIC
// closes pc once it stopped accepting and the last session over it ended.
//
// A connection counts toward PreAuth.MaxConns and PreAuth.MaxConnsPerIP from its first packet
// until its Hello is accepted: over either cap it is refused before its handshake. Every new
// connection first proves its source address with a QUIC Retry (one round trip), so that
// spoofed packets take no place. The handshake is bounded by PreAuth.HelloTimeout, and
// HelloTimeout runs again from its end for the Hello.
func ServeQUIC(s *Server, pc net.PacketConn) error {
	q, err := quicTransport()
	if err != nil {
		_ = pc.Close()
		return err
	}
	if s.cfg.TLSConfig == nil {
		_ = pc.Close()
		return fmt.Errorf("tunnel: ServeQUIC needs ServerConfig.TLSConfig: %w", ErrInvalid)
	}
	ql, err := q.Listen(pc, s.cfg.TLSConfig, mux.ListenOptions{OpenTimeout: s.cfg.Timeouts.Open,
		HandshakeTimeout: s.cfg.PreAuth.HelloTimeout, Admit: admitQUIC(s)})
	if err != nil {
		_ = pc.Close()
		return fmt.Errorf("tunnel: %w", err)
	}
	l := quicListener{ql}
	if !s.track(l) {
		_ = ql.Close()
		return ErrServerClosed
	}
	defer s.untrack(l)
	for {
		sess, adm, err := ql.Accept(context.Background())
		if err != nil {
			_ = ql.Close()
			if s.shuttingDown() {
				return ErrServerClosed
			}
			return fmt.Errorf("tunnel: accepting QUIC connections: %w", err)
		}
		slot, _ := adm.(*throttle.Slot)
		if !s.spawn(func() { _ = serveMuxSession(s, sess, slot, TransportQUIC) }) {
			slot.Release()
			_ = sess.Close()
			_ = ql.Close()
			return ErrServerClosed
		}
	}
}

// admitQUIC returns the admission of s's QUIC listener: it gives a new QUIC connection its
// place among those not yet authenticated (PreAuth.MaxConns, MaxConnsPerIP), before its
// handshake, or refuses it (nil).
func admitQUIC(s *Server) func(remote net.Addr) mux.Admission {
	return func(remote net.Addr) mux.Admission {
		if slot := s.preAuth.Acquire(throttle.KeyOf(remote)); slot != nil {
			return slot
		}
		return nil
	}
}

// serveMuxSession serves a connector session over m, a multiplexer that runs already, as
// serveSession does over a connection.
func serveMuxSession(s *Server, m mux.Session, slot *throttle.Slot, transport string) error {
	sess, err := newEdgeSessionOver(s, m, s.log.With(zap.String("remote", m.RemoteAddr().String())), slot)
	if err != nil {
		slot.Release()
		return err
	}
	sess.transport = transport
	return sess.serve()
}

// listenQUIC opens the UDP socket of ServerConfig.QUICAddr for ListenAndServe, or returns
// nil when it is not set.
func listenQUIC(s *Server) (net.PacketConn, error) {
	addr := s.cfg.QUICAddr
	if addr == "" {
		return nil, nil
	}
	if _, err := quicTransport(); err != nil {
		return nil, err
	}
	if s.cfg.TLSConfig == nil {
		return nil, fmt.Errorf("tunnel: QUICAddr needs TLSConfig: QUIC is always TLS 1.3, and the edge presents its control listener's certificate: %w", ErrInvalid)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: listen %s (quic): %w", addr, err)
	}
	s.log.Info("listening", zap.String("listener", "quic"), zap.Stringer("addr", pc.LocalAddr()), zap.Bool("tls", true))
	return pc, nil
}

// quicListener is a QUIC listener among the server's listeners, for Shutdown and Close to
// close it; its sessions are accepted by ServeQUIC, never by Accept.
type quicListener struct{ mux.Listener }

func (quicListener) Accept() (net.Conn, error) {
	return nil, errors.New("tunnel: a QUIC listener accepts sessions, not connections")
}
