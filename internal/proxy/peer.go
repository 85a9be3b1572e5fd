package proxy

import (
	"context"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"
)

// Abandon ends st, a data stream of t opened with OpenForward, before its exchange ended:
// the connector is told to reset it.
func (t *Tunnel) Abandon(st mux.Stream) { t.abandon(st) }

// OpenForward opens a data stream to t's connector for a stream another edge of a cluster
// forwarded: it writes the envelope and waits for the connector's acknowledgement, as
// every dispatch does, so that the forwarding edge may still retry elsewhere when it fails.
// The caller copies the bytes and closes the stream.
func (t *Tunnel) OpenForward(ctx context.Context, remoteAddr string, timeout time.Duration) (mux.Stream, error) {
	return t.open(ctx, remoteAddr, timeout)
}
