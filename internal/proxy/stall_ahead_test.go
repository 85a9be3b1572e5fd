package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
)

// heldWriter is a public response writer whose writes block until released, or fail once
// its write deadline is set in the past (as a cut does).
type heldWriter struct {
	h        http.Header
	mu       sync.Mutex
	held     bool
	released chan struct{}
	cut      chan struct{}
	cutOnce  sync.Once
	got      bytes.Buffer
}

func newHeldWriter() *heldWriter {
	return &heldWriter{h: http.Header{}, held: true, released: make(chan struct{}), cut: make(chan struct{})}
}

func (w *heldWriter) Header() http.Header { return w.h }
func (w *heldWriter) WriteHeader(int)     {}
func (w *heldWriter) FlushError() error   { return nil }

func (w *heldWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	held := w.held
	w.mu.Unlock()
	if held {
		select {
		case <-w.released:
		case <-w.cut:
			return 0, os.ErrDeadlineExceeded
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got.Write(p)
	return len(p), nil
}

func (w *heldWriter) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && !t.After(time.Now()) {
		w.cutOnce.Do(func() { close(w.cut) })
	}
	return nil
}

func (w *heldWriter) release() {
	w.mu.Lock()
	w.held = false
	w.mu.Unlock()
	close(w.released)
}

// copyThrough copies body to w as the reverse proxy does (read a chunk, write it), with the
// body wrapped by the watch, and returns the copy's error and what the body's Close said.
func copyThrough(sw *stallWatch, body io.ReadCloser) (error, error) {
	resp := &http.Response{StatusCode: http.StatusOK, ContentLength: -1, Body: body}
	sw.expectResponse(mux.StreamWindow, resp)
	buf := make([]byte, 4<<10)
	var err error
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := sw.Write(buf[:n]); werr != nil {
				err = werr
				break
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err = rerr
			break
		}
	}
	return err, resp.Body.Close()
}

func stallHTTP(timeout time.Duration) *HTTP {
	return NewHTTP(Config{Registry: group.NewRegistry(group.Config{}), ResponseStallTimeout: timeout,
		StalledBytesPerConn: 16 << 20, StalledBytesPerClient: 32 << 20, StalledBytes: 256 << 20})
}

// closeTracker is a body that records its Close.
type closeTracker struct {
	io.Reader
	closed chan struct{}
}

func (c *closeTracker) Close() error { close(c.closed); return nil }

// TestStalledResponseReadAhead: a response of unknown length whose write stalls is read
// ahead before it is charged: one whose member has finished (its body ends within the
// read-ahead) is charged its rest (the write that blocks), not a window, and is delivered whole when its client
// reads again; one whose body goes on is charged its window as soon as the read-ahead's
// chunk is full, and every byte reaches the client in order through the read-ahead's
// buffer.
func TestStalledResponseReadAhead(t *testing.T) {
	t.Run("finished", func(t *testing.T) {
		h := stallHTTP(time.Minute)
		w := newHeldWriter()
		var sw stallWatch
		sw.start(h, w, "192.0.2.7:1")
		body := &closeTracker{Reader: bytes.NewReader(bytes.Repeat([]byte("x"), 3<<10)), closed: make(chan struct{})}
		done := make(chan [2]error, 1)
		go func() { e1, e2 := copyThrough(&sw, body); done <- [2]error{e1, e2} }()
		require.Eventually(t, func() bool { return h.StalledBytes() == 3<<10 }, 5*time.Second, time.Millisecond,
			"a finished response is charged its rest: the blocked write")
		sw.mu.Lock()
		require.True(t, sw.wasStall)
		require.Equal(t, int64(3<<10), sw.length, "the read-ahead found the body's end")
		sw.mu.Unlock()
		w.release()
		require.Equal(t, [2]error{}, <-done)
		<-body.closed
		require.Equal(t, bytes.Repeat([]byte("x"), 3<<10), w.got.Bytes())
		h.endResponse(w, httptest.NewRequest(http.MethodGet, "/", nil), &sw)
		require.Zero(t, h.StalledBytes())
	})
	t.Run("long", func(t *testing.T) {
		h := stallHTTP(time.Minute)
		w := newHeldWriter()
		var sw stallWatch
		sw.start(h, w, "192.0.2.7:1")
		src := make([]byte, 1<<20)
		for i := range src {
			src[i] = byte(i * 7 / 3)
		}
		done := make(chan [2]error, 1)
		go func() {
			e1, e2 := copyThrough(&sw, io.NopCloser(bytes.NewReader(src)))
			done <- [2]error{e1, e2}
		}()
		require.Eventually(t, func() bool { return h.StalledBytes() == mux.StreamWindow }, 5*time.Second, time.Millisecond)
		w.release()
		require.Equal(t, [2]error{}, <-done)
		require.Equal(t, src, w.got.Bytes(), "the body reached the client whole and in order")
		h.endResponse(w, httptest.NewRequest(http.MethodGet, "/", nil), &sw)
		require.Zero(t, h.StalledBytes())
	})
}

// TestStalledResponseQuietMember: a stalled response whose member sends nothing more is
// charged its window once probeWait has passed; when the member then ends it, the charge
// comes down to its rest. A response cut while its read-ahead waits for the member ends
// that wait (the body is closed): no goroutine is left behind (goleak).
func TestStalledResponseQuietMember(t *testing.T) {
	t.Run("ends later", func(t *testing.T) {
		h := stallHTTP(time.Minute)
		w := newHeldWriter()
		var sw stallWatch
		sw.start(h, w, "192.0.2.7:1")
		pr, pw := io.Pipe()
		done := make(chan [2]error, 1)
		go func() { e1, e2 := copyThrough(&sw, pr); done <- [2]error{e1, e2} }()
		go func() { _, _ = pw.Write(make([]byte, 3<<10)) }()
		start := time.Now()
		require.Eventually(t, func() bool { return h.StalledBytes() == mux.StreamWindow }, 5*time.Second, time.Millisecond)
		require.GreaterOrEqual(t, time.Since(start), probeWait, "charged before the read-ahead had its time")
		require.NoError(t, pw.Close())
		require.Eventually(t, func() bool { return h.StalledBytes() == 3<<10 }, 5*time.Second, time.Millisecond,
			"the member's end was learnt: the response holds only its blocked write")
		w.release()
		require.Equal(t, [2]error{}, <-done)
		require.Equal(t, 3<<10, w.got.Len())
		h.endResponse(w, httptest.NewRequest(http.MethodGet, "/", nil), &sw)
	})
	t.Run("cut while probing", func(t *testing.T) {
		h := NewHTTP(Config{Registry: group.NewRegistry(group.Config{}), ResponseStallTimeout: time.Minute,
			StalledBytesPerConn: mux.StreamWindow - 1})
		w := newHeldWriter()
		var sw stallWatch
		sw.start(h, w, "192.0.2.7:1")
		pr, pw := io.Pipe()
		defer pw.Close()
		done := make(chan [2]error, 1)
		go func() { e1, e2 := copyThrough(&sw, pr); done <- [2]error{e1, e2} }()
		go func() { _, _ = pw.Write(make([]byte, 3<<10)) }()
		res := <-done
		require.True(t, errors.Is(res[0], os.ErrDeadlineExceeded), "%v", res[0])
		require.Equal(t, uint64(1), h.cfg.Stats.ResponsesCut.ConnBudget.Load())
		h.endResponse(w, httptest.NewRequest(http.MethodGet, "/", nil), &sw)
		require.Zero(t, h.StalledBytes())
	})
}
