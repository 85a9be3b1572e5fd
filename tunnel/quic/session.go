package quic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	qgo "github.com/quic-go/quic-go"

	"github.com/warren-tunnel/warren/internal/mux"
)

// session is a QUIC connection as a mux.Session.
type session struct {
	conn *qgo.Conn
	// openTimeout bounds OpenStream's wait for the peer's stream credit (0: no wait).
	openTimeout time.Duration
	accepted    atomic.Int32
	// onClose, if set, runs once, after the first Close (the listener's count of sessions).
	onClose   func()
	closeOnce sync.Once
}

func newSession(conn *qgo.Conn, openTimeout time.Duration) *session {
	return &session{conn: conn, openTimeout: openTimeout}
}

// OpenStream opens a stream; at the peer's limit of open streams it waits for one to end,
// up to the open timeout.
func (s *session) OpenStream() (mux.Stream, error) {
	st, err := s.conn.OpenStream()
	if err != nil && s.openTimeout > 0 && isStreamLimit(err) {
		ctx, cancel := context.WithTimeout(s.conn.Context(), s.openTimeout)
		st, err = s.conn.OpenStreamSync(ctx)
		cancel()
	}
	if err != nil {
		return nil, fmt.Errorf("quic: opening a stream: %w", err)
	}
	return newStream(st, s), nil
}

// isStreamLimit reports whether err is OpenStream's "too many open streams".
func isStreamLimit(err error) bool {
	var limit qgo.StreamLimitReachedError
	return errors.As(err, &limit)
}

func (s *session) AcceptStream(ctx context.Context) (mux.Stream, error) {
	st, err := s.conn.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	s.accepted.Add(1)
	return newStream(st, s), nil
}

// GoAway does nothing: an edge lets its connector open one stream from the start.
func (s *session) GoAway() error { return nil }

// NumStreams is how many streams the peer opened.
func (s *session) NumStreams() int { return int(s.accepted.Load()) }

// Ping reports the connection's smoothed round-trip time, or that it ended: QUIC's own
// keep-alive and idle timeout watch the peer.
func (s *session) Ping() (time.Duration, error) {
	if err := context.Cause(s.conn.Context()); err != nil {
		return 0, err
	}
	return s.conn.ConnectionStats().SmoothedRTT, nil
}

func (s *session) Close() error {
	err := s.conn.CloseWithError(codeClosed, "")
	if s.onClose != nil {
		s.closeOnce.Do(s.onClose)
	}
	return err
}

// Linger waits up to d for the peer to close the connection (mux.Linger): Close would drop
// the stream data not sent yet, and the peer closes once it has read the edge's last word.
func (s *session) Linger(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.conn.Context().Done():
	case <-t.C:
	}
}

func (s *session) CloseChan() <-chan struct{} { return s.conn.Context().Done() }

func (s *session) IsClosed() bool { return s.conn.Context().Err() != nil }

func (s *session) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

// stream is a QUIC stream as a mux.Stream. Close half-closes, as yamux's does: the receive
// side stays open for the peer's answer, but no longer than mux.StreamCloseTimeout, and not
// at all once this side gave up reading (a read deadline in the past).
//
// Write, Close and Abort may be called while a Read is under way, as on any net.Conn.
type stream struct {
	*qgo.Stream
	sess *session
	id   uint32

	// readEnded is set once a Read returned the stream's end or an error other than a
	// deadline's;
	// readGivenUp once a read deadline in the past was set.
	readEnded, readGivenUp atomic.Bool
	closeOnce              sync.Once
}

func newStream(st *qgo.Stream, s *session) *stream {
	// Client-initiated bidirectional streams are 0, 4, 8…, the server's 1, 5, 9…: the
	// sequence number is the same on both sides, and increases with each open.
	return &stream{Stream: st, sess: s, id: uint32(st.StreamID()>>2) + 1}
}

func (s *stream) StreamID() uint32 { return s.id }

// Shrink does nothing: quic-go keeps no receive buffer for an idle stream.
func (s *stream) Shrink() {}

func (s *stream) LocalAddr() net.Addr  { return s.sess.conn.LocalAddr() }
func (s *stream) RemoteAddr() net.Addr { return s.sess.conn.RemoteAddr() }

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p)
	if err != nil {
		if !errors.Is(err, os.ErrDeadlineExceeded) { // a deadline ends a read, not the stream
			s.readEnded.Store(true)
		}
		err = streamErr(err)
	}
	return n, err
}

func (s *stream) Write(p []byte) (int, error) {
	n, err := s.Stream.Write(p)
	if err != nil {
		err = streamErr(err)
	}
	return n, err
}

// streamErr makes a reset from the peer a mux.ErrStreamReset.
func streamErr(err error) error {
	var se *qgo.StreamError
	if errors.As(err, &se) && se.Remote {
		return &resetError{err}
	}
	return err
}

// resetError is a stream reset by the peer: it is mux.ErrStreamReset, and quic-go's error.
type resetError struct{ err error }

func (e *resetError) Error() string   { return "quic: the peer reset the stream: " + e.err.Error() }
func (e *resetError) Unwrap() []error { return []error{mux.ErrStreamReset, e.err} }

func (s *stream) SetReadDeadline(t time.Time) error {
	s.noteReadDeadline(t)
	return s.Stream.SetReadDeadline(t)
}

func (s *stream) SetDeadline(t time.Time) error {
	s.noteReadDeadline(t)
	return s.Stream.SetDeadline(t)
}

func (s *stream) noteReadDeadline(t time.Time) {
	s.readGivenUp.Store(!t.IsZero() && !t.After(time.Now()))
}

// Close half-closes the stream (the peer reads its end after what was written).
func (s *stream) Close() error {
	err := s.Stream.Close()
	s.closeOnce.Do(func() {
		switch {
		case s.readEnded.Load():
		case s.readGivenUp.Load():
			s.Stream.CancelRead(codeUnread)
		default:
			// A peer that never ends its side must not hold the stream for ever.
			time.AfterFunc(closeTimeout, func() {
				if !s.readEnded.Load() {
					s.Stream.CancelRead(codeUnread)
				}
			})
		}
	})
	return err
}

// CloseAndDrain closes the stream for a caller that reads no more of it (mux.Refuse), and
// reads and drops what the peer still sends until its end, for up to d: quic-go releases a
// stream only once its receive side ended, which would otherwise wait for the close timeout.
func (s *stream) CloseAndDrain(d time.Duration) {
	_ = s.Close()
	_ = s.Stream.SetReadDeadline(time.Now().Add(d))
	if _, err := io.Copy(io.Discard, s.Stream); err != nil {
		s.Stream.CancelRead(codeUnread)
	}
	s.readEnded.Store(true)
}

// Abort cuts the stream both ways: the peer's reads and writes fail with a reset.
func (s *stream) Abort() {
	s.readGivenUp.Store(true)
	s.Stream.CancelWrite(codeAborted)
	s.Stream.CancelRead(codeAborted)
	_ = s.Stream.SetDeadline(time.Unix(1, 0))
	s.closeOnce.Do(func() {})
}
