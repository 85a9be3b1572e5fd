package connectorcmd

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestReloadKeepsTheEdges: a reload that changes the edges says the change needs a restart
// (the session keeps its edges); server: x and servers: [x] are the same edges.
func TestReloadKeepsTheEdges(t *testing.T) {
	prev := &config.Connector{Servers: []string{"a:1", "b:1"}}
	require.Equal(t, []string{"server (a:1, b:1 -> a:1, c:1): the connector keeps its session with a:1, b:1; restart it to move"},
		notAppliedSettings(prev, &config.Connector{Servers: []string{"a:1", "c:1"}}))
	require.Empty(t, notAppliedSettings(&config.Connector{Server: "a:1"}, &config.Connector{Servers: []string{"a:1"}}))
}
