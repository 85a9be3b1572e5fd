package mux

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/hashicorp/yamux"
)

// Session is one connector session's multiplexer, as both sides use it: yamux over a byte
// stream (TCP, TLS, WebSocket: Client, Server) or a QUIC connection (package tunnel/quic,
// through RegisterQUIC). The edge opens the data streams; the connector opens only its
// control stream.
type Session interface {
	// OpenStream opens a stream to the peer without waiting for it to be accepted.
	OpenStream() (Stream, error)
	// AcceptStream waits for the next stream the peer opened, until ctx ends or the
	// session closes.
	AcceptStream(ctx context.Context) (Stream, error)
	// GoAway refuses every stream the peer opens from now on (the edge, once it has the
	// connector's control stream). A QUIC edge lets in one stream from the start instead.
	GoAway() error
	// NumStreams is how many streams are open: over QUIC, how many the peer opened.
	NumStreams() int
	// Ping checks that the peer still answers (a QUIC session answers from its state: its
	// keep-alive watches the peer).
	Ping() (time.Duration, error)
	// Close ends the session and every stream of it.
	Close() error
	// CloseChan is closed once the session ended.
	CloseChan() <-chan struct{}
	// IsClosed reports whether the session ended.
	IsClosed() bool
	// RemoteAddr is the peer's address (a *net.UDPAddr over QUIC).
	RemoteAddr() net.Addr
}

// Stream is one stream of a Session: a net.Conn whose Close half-closes (the peer reads
// the end, and this side can still read until the peer closes too). *yamux.Stream is one as
// it is, so the TCP path pays no wrapper.
type Stream interface {
	net.Conn
	// StreamID is the stream's number, the same on both sides, increasing in the order
	// the streams were opened (Resets, unread notices).
	StreamID() uint32
	// Shrink lets go of the stream's receive buffer while it is empty (a no-op where the
	// transport keeps none while idle).
	Shrink()
}

// aborter is a Stream that can end both directions at once with a reset the peer sees (QUIC).
type aborter interface{ Abort() }

// Abort ends st at once, both ways: pending reads and writes return, and the peer learns
// that the stream was cut (over QUIC by a stream reset; over yamux, which has no per-stream
// reset, by a half-close, with the caller's wire.Reset telling the rest).
func Abort(st Stream) {
	if a, ok := st.(aborter); ok {
		a.Abort()
		return
	}
	_ = st.SetDeadline(pastTime)
	_ = st.Close()
}

// lingerer is a Session whose Close drops what its streams have not sent yet (QUIC: its
// CONNECTION_CLOSE goes out at once), where a yamux stream's write has reached the connection
// once it returns.
type lingerer interface{ Linger(d time.Duration) }

// Linger gives the peer of s up to d to receive what was written last (a refusal, a goodbye)
// and close the session itself, before the caller closes it; it returns at once over yamux.
func Linger(s Session, d time.Duration) {
	if l, ok := s.(lingerer); ok {
		l.Linger(d)
	}
}

// pastTime is a deadline that has always passed.
var pastTime = time.Unix(1, 0)

// IsTimeout reports whether err is a stream's deadline passing, on either transport.
func IsTimeout(err error) bool {
	return errors.Is(err, yamux.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded)
}

// IsStreamReset reports whether err says that the peer reset the stream (yamux's RST flag,
// a QUIC stream reset or stop-sending: ErrStreamReset).
func IsStreamReset(err error) bool {
	return errors.Is(err, yamux.ErrConnectionReset) || errors.Is(err, ErrStreamReset)
}

// Unwrapper is a wrapper of a Stream (the edge's resettable, the connector's streamConn)
// that names it, so that the end of a yamux stream whose session died is still told from
// a clean end through it.
type Unwrapper interface{ MuxStream() Stream }

// sessionEOF returns ErrSessionEnded for r, a Stream or a wrapper of one that read io.EOF,
// if it is a yamux stream whose session ended, and io.EOF otherwise.
func sessionEOF(r io.Reader) error {
	if w, ok := r.(Unwrapper); ok {
		r = w.MuxStream()
	}
	if y, ok := r.(*yamux.Stream); ok && y.Session().IsClosed() {
		return ErrSessionEnded
	}
	return io.EOF
}

// yamuxSession is a Session over yamux. The value is a pointer to yamux's own, so a stream
// it hands out is the *yamux.Stream itself.
type yamuxSession struct{ *yamux.Session }

// Yamux returns s as a Session.
func Yamux(s *yamux.Session) Session { return yamuxSession{s} }

func (s yamuxSession) OpenStream() (Stream, error) {
	st, err := s.Session.OpenStream()
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (s yamuxSession) AcceptStream(ctx context.Context) (Stream, error) {
	st, err := s.Session.AcceptStreamWithContext(ctx)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// ClearReadDeadline removes st's read deadline, and ClearDeadline both deadlines. yamux
// stores a deadline as an interface value: called on the concrete stream with the zero
// time written out, the compiler boxes it once, statically, where a call through Stream
// would allocate on every request.
func ClearReadDeadline(st Stream) {
	if y, ok := st.(*yamux.Stream); ok {
		_ = y.SetReadDeadline(time.Time{})
		return
	}
	_ = st.SetReadDeadline(time.Time{})
}

// ClearDeadline removes both of st's deadlines (see ClearReadDeadline).
func ClearDeadline(st Stream) {
	if y, ok := st.(*yamux.Stream); ok {
		_ = y.SetDeadline(time.Time{})
		return
	}
	_ = st.SetDeadline(time.Time{})
}
