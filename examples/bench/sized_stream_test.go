package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSizedStream sends a stream that announces its length to hashSizedConn, without a
// half-close (as frp's TCP proxies need), and checks that the sink counted and checksummed
// each stream.
func TestSizedStream(t *testing.T) {
	sink, err := startTCPBackend(hashSizedConn)
	require.NoError(t, err)
	defer sink.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := newStreamData(7, 3<<20+5)
	bps, err := bulkStreams(ctx, []string{sink.addr(), sink.addr()}, []streamData{d, d}, true)
	require.NoError(t, err)
	require.Positive(t, bps)

}
