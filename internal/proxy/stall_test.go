package proxy

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
)

// TestStallLedgerBudgets: charges are refused past any of the three budgets (per
// connection, per client address, in all) and charge nothing then; a release gives room
// back; an IPv6 client is its /64, whatever its port or interface id; a connection whose
// address is not an IP address counts toward the edge's budget only; and nothing is left
// once every charge is released.
func TestStallLedgerBudgets(t *testing.T) {
	l := newStallLedger(10, 15, 40)
	a := throttle.KeyOfString("192.0.2.1:1000")
	require.Equal(t, notCut, l.charge(a, "192.0.2.1:1000", 6))
	require.Equal(t, cutConnBudget, l.charge(a, "192.0.2.1:1000", 5), "the connection holds 6 of 10")
	require.Equal(t, notCut, l.charge(a, "192.0.2.1:1000", 4))
	require.Equal(t, notCut, l.charge(a, "192.0.2.1:2000", 5))
	require.Equal(t, cutClientBudget, l.charge(a, "192.0.2.1:3000", 1), "the address holds 15 of 15")
	require.Equal(t, int64(15), l.held.Load())

	v6 := throttle.KeyOfString("[2001:db8:1:2::1]:1000")
	require.Equal(t, v6, throttle.KeyOfString("[2001:db8:1:2:ffff::9]:5"))
	require.Equal(t, notCut, l.charge(v6, "[2001:db8:1:2::1]:1000", 10))
	require.Equal(t, cutClientBudget, l.charge(v6, "[2001:db8:1:2:ffff::9]:5", 6), "one /64, one budget")
	require.Equal(t, cutEdgeBudget, l.charge(throttle.KeyOfString("198.51.100.1:1"), "198.51.100.1:1", 16),
		"the edge holds 25 of 40")
	pipe := throttle.KeyOfString("pipe")
	require.True(t, pipe.IsZero())
	require.Equal(t, notCut, l.charge(pipe, "pipe", 15), "no address: the edge's budget only")
	require.Equal(t, cutEdgeBudget, l.charge(pipe, "pipe", 1))

	l.release(pipe, "pipe", 15)
	l.release(a, "192.0.2.1:2000", 5)
	require.Equal(t, notCut, l.charge(a, "192.0.2.1:3000", 5), "released room is given again")
	require.Equal(t, cutConnBudget, l.charge(throttle.KeyOfString("203.0.113.1:1"), "203.0.113.1:1", 11),
		"more than a connection's budget in one charge")

	l.release(a, "192.0.2.1:1000", 6)
	l.release(a, "192.0.2.1:1000", 4)
	l.release(a, "192.0.2.1:3000", 5)
	l.release(v6, "[2001:db8:1:2::1]:1000", 10)
	require.Zero(t, l.held.Load())
	for i := range l.shards {
		require.Empty(t, l.shards[i].clients, "shard %d keeps an address with no charge", i)
	}
}

// TestStallLedgerWithoutBudgets: with no budget nothing is refused, and the bytes held are
// still counted.
func TestStallLedgerWithoutBudgets(t *testing.T) {
	l := newStallLedger(0, 0, 0)
	k := throttle.KeyOfString("192.0.2.1:1")
	for range 100 {
		require.Equal(t, notCut, l.charge(k, "192.0.2.1:1", 1<<30))
	}
	require.Equal(t, int64(100<<30), l.held.Load())
}

// TestStalledResponseCharge: a stalled response is charged its member's window, or the rest
// of its body when that is known and shorter; a response no member gave (the edge's own
// error pages) holds no member stream and is charged nothing.
func TestStalledResponseCharge(t *testing.T) {
	for _, tc := range []struct {
		window, length, written, want int64
	}{
		{mux.StreamWindow, -1, 1 << 30, mux.StreamWindow},
		{mux.StreamWindow, 100 << 20, 10 << 20, mux.StreamWindow},
		{mux.StreamWindow, 100 << 10, 36 << 10, 64 << 10},
		{h2StreamWindow, -1, 0, h2StreamWindow},
		{h2StreamWindow, 3 << 20, 2<<20 + 1, 1<<20 - 1},
		{0, -1, 0, 0},
		{mux.StreamWindow, 10, 10, 0},
	} {
		w := &stallWatch{window: tc.window, length: tc.length, written: tc.written}
		require.Equal(t, tc.want, w.holdable(), "%+v", tc)
	}
	require.Equal(t, int64(h2StreamWindow), windowOf(&h2Exchange{}))
	require.Equal(t, int64(mux.StreamWindow), windowOf(&memberConn{}))
}

// discardWriter is a ResponseWriter that takes every write at once, with a write deadline
// as an HTTP/1.x server's has.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header              { return d.h }
func (d *discardWriter) Write(p []byte) (int, error)      { return len(p), nil }
func (d *discardWriter) WriteHeader(int)                  {}
func (d *discardWriter) SetWriteDeadline(time.Time) error { return nil }
func (d *discardWriter) FlushError() error                { return nil }

// BenchmarkStallWatch is what watching a response costs a request whose client keeps up:
// a small body (net/http buffers it: no timer), and one of 64 KiB written in one go (a
// timer armed, then stopped), with the handler's end (endResponse) included. The watch's
// own allocation here (160 B) is not the edge's: there it is part of the request's context.
func BenchmarkStallWatch(b *testing.B) {
	h := NewHTTP(Config{Registry: group.NewRegistry(group.Config{}), ResponseStallTimeout: time.Minute,
		StalledBytesPerConn: 16 << 20, StalledBytesPerClient: 32 << 20, StalledBytes: 256 << 20})
	r := httptest.NewRequest(http.MethodGet, "http://app.example/", nil)
	for _, size := range []int{2, 64 << 10} {
		body := make([]byte, size)
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			w := &discardWriter{h: http.Header{}}
			for b.Loop() {
				var sw stallWatch
				sw.start(h, w, "192.0.2.7:40000")
				sw.expect(mux.StreamWindow, int64(size))
				_, _ = sw.Write(body)
				h.endResponse(w, r, &sw)
			}
		})
	}
}
