package mux

import (
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
)

// Multiplexer tuning. Both sides use the same settings; each one is a deliberate choice.
const (
	// streamWindow is each stream's receive window. yamux's default of 256 KiB caps one
	// stream near window/RTT: about 5 MB/s at a 50 ms RTT. 4 MiB allows ~80 MB/s per stream on
	// that path while bounding the worst-case buffering to 4 MiB per busy stream whose reader
	// is slower than its writer (buffers grow lazily, so idle streams cost nothing).
	streamWindow = 4 << 20

	// acceptBacklog is how many opened-but-not-yet-accepted streams the connector queues;
	// yamux also uses it to bound each side's opens still waiting for their SYN-ACK. The
	// connector's accept loop hands each stream to its own goroutine at once, so the queue
	// only absorbs bursts; a larger backlog means fewer streams reset under a burst of new
	// public connections.
	acceptBacklog = 1024

	// edgeAcceptBacklog is the edge's: it accepts only the control stream (then GoAway
	// refuses the rest), so its queue (8 bytes a slot, allocated per session) stays small,
	// while 64 opens in flight per connector is far more than a SYN-ACK round trip on a
	// busy tunnel needs.
	edgeAcceptBacklog = 64

	// keepAliveInterval: both sides ping so that each notices a dead peer (a NAT that
	// dropped the mapping, a host that vanished) within about interval + write timeout, and
	// the edge removes that connector's members instead of routing to them.
	keepAliveInterval = 15 * time.Second

	// connWriteTimeout is yamux's safety valve: a frame that cannot be written in this time
	// means the connection is dead, and the session closes.
	connWriteTimeout = 10 * time.Second

	// streamCloseTimeout bounds how long a stream may stay half-closed after this side
	// closed it. It is what finally frees a stream whose peer stopped reading after an
	// abort (yamux has no per-stream reset), so it cannot be infinite; it also bounds a
	// legitimate TCP half-close (client done sending, response still flowing) to this long.
	streamCloseTimeout = 5 * time.Minute
)

// ClientConfig returns the connector's yamux configuration. It opens only its control stream,
// so it needs no open timeout (see ServerConfig).
func ClientConfig(log *zap.Logger) *yamux.Config { return config(log, false, 0) }

// ServerConfig returns the edge's yamux configuration; openTimeout is the edge's deadline for
// a whole stream open (ServerConfig.Timeouts.Open in package tunnel).
//
// StreamOpenTimeout bounds, on the edge, how long an opened stream may wait for the
// connector's SYN-ACK; when it expires yamux closes the *whole session*. That is right here:
// the connector's accept loop acknowledges every stream at once (before it dials its
// backend), so a connector that leaves an open unacknowledged that long is broken, and
// without a bound the edge's opens to it would block for ever once yamux's limit of
// unacknowledged opens is reached. It is 9/10 of openTimeout, the edge's deadline for the
// whole open (SYN-ACK, then the envelope's acknowledgement after the backend dial): it must
// fire first, because closing a stream that was never acknowledged cancels yamux's timer and
// leaves its slot taken for streamCloseTimeout.
func ServerConfig(log *zap.Logger, openTimeout time.Duration) *yamux.Config {
	return config(log, true, openTimeout)
}

func config(log *zap.Logger, edge bool, openTimeout time.Duration) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.AcceptBacklog = acceptBacklog
	cfg.StreamOpenTimeout = 0
	if edge {
		cfg.AcceptBacklog = edgeAcceptBacklog
		cfg.StreamOpenTimeout = max(openTimeout*9/10, time.Millisecond)
	}
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = keepAliveInterval
	cfg.ConnectionWriteTimeout = connWriteTimeout
	cfg.MaxStreamWindowSize = streamWindow
	cfg.StreamCloseTimeout = streamCloseTimeout
	cfg.LogOutput = nil
	cfg.Logger = zap.NewStdLog(log.Named("yamux"))
	return cfg
}

// Client starts the connector's yamux session over conn (wrapped to save system calls).
func Client(conn net.Conn, log *zap.Logger) (Session, error) {
	s, err := YamuxClient(conn, log)
	if err != nil {
		return nil, err
	}
	return Yamux(s), nil
}

// Server starts the edge's yamux session over conn (wrapped to save system calls);
// openTimeout is as for ServerConfig.
func Server(conn net.Conn, log *zap.Logger, openTimeout time.Duration) (Session, error) {
	s, err := YamuxServer(conn, log, openTimeout)
	if err != nil {
		return nil, err
	}
	return Yamux(s), nil
}

// YamuxClient is Client as yamux's own session (the edges' cluster links, which stay on
// yamux).
func YamuxClient(conn net.Conn, log *zap.Logger) (*yamux.Session, error) {
	return yamux.Client(newConn(conn), ClientConfig(log))
}

// YamuxServer is Server as yamux's own session (the edges' cluster links).
func YamuxServer(conn net.Conn, log *zap.Logger, openTimeout time.Duration) (*yamux.Session, error) {
	return yamux.Server(newConn(conn), ServerConfig(log, openTimeout))
}
