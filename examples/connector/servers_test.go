package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServersFollowTheEdge: a connector given two edges attaches to the first; when that
// edge goes away it serves its tunnel from the second, and status says so.
func TestServersFollowTheEdge(t *testing.T) {
	e1, e2 := startEdge(t), startEdge(t)
	b := startBackend(t, "web")
	c := startConnector(t, e1, "servers: ["+e1.control+", "+e2.control+"]\ntunnels:\n"+tunnelYAML("web", b.port, poolYAML("pool")))

	st := c.status(t)
	require.Equal(t, e1.control, st.Edge)
	require.Equal(t, []string{e1.control, e2.control}, st.Servers)
	require.Empty(t, st.EdgeAddr, "an IP address is not resolved")
	code, out, _ := c.ctl("status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "edge:       "+e1.control+" (connected, 0 reconnects)\nservers:    "+e1.control+", "+e2.control+"\n")
	status, body, err := e1.get("pool.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "web", body)

	e1.close()
	require.Eventually(t, func() bool {
		status, body, err := e2.get("pool.localhost", "/")
		return err == nil && status == http.StatusOK && body == "web"
	}, 15*time.Second, 20*time.Millisecond, "the tunnel serves from the second edge")
	st = c.status(t)
	require.True(t, st.Connected)
	require.Equal(t, e2.control, st.Edge)
	require.Equal(t, 1, st.Reconnects)
	ts, ok := tunnelNamed(st, "web")
	require.True(t, ok)
	require.Equal(t, "registered", ts.State)
}
