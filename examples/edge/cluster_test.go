package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

const (
	clusterToken = "edges-secret-0123456789"
	adminToken   = "admin-token-0123456789"
)

// startNATS starts an embedded NATS server with JetStream on 127.0.0.1; it stops at the
// end of the test.
func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second), "NATS not ready")
	return ns.ClientURL()
}

func clusterTable(natsURL, id string, peer int, extra string) string {
	return fmt.Sprintf("[cluster]\nnats_urls = [%q]\nedge_id = %q\nadvertise = \"127.0.0.1:%d\"\ntoken = %q\nlease_secs = 1\n%s",
		natsURL, id, peer, clusterToken, extra)
}

// TestCheckClusterBadKeyPair: -check loads the [cluster.tls] key pair, and one that does
// not load is an error naming the file and the table.
func TestCheckClusterBadKeyPair(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "peer.crt"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "peer.key"), []byte("not a key"), 0o600))
	path := filepath.Join(dir, "server.toml")
	text := "[server]\ndomain = \"localhost\"\n" + clusterTable("nats://10.0.0.1:4222", "edge-a", 7443, "[cluster.tls]\ncert_path = \"peer.crt\"\nkey_path = \"peer.key\"\n")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"-check", "-config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), path+": cluster: tls: loading cert_path and key_path")
}

// TestCheckClusterNoNATS: -check validates [cluster] without connecting to NATS (nothing
// listens on its URL), and refuses [cluster] with state_dir.
func TestCheckClusterNoNATS(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "server.toml")
	unused := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	require.NoError(t, os.WriteFile(path, []byte(edgeFile(freePort(t), freePort(t), oldToken, clusterTable(unused, "a", freePort(t), ""))), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, runWith(context.Background(), func() {}, []string{"-check", "-config", path}, &stdout, &stderr), stderr.String())
	require.Equal(t, "ok\n", stdout.String())

	bad := "[server]\ndomain = \"localhost\"\nstate_dir = \"state\"\n" + clusterTable(unused, "a", 7443, "")
	require.NoError(t, os.WriteFile(path, []byte(bad), 0o600))
	stdout.Reset()
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"-check", "-config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), path+":3: server.state_dir: cannot be combined with [cluster]")
}

// TestRunCluster: two edges run from server.toml files with [cluster] join one cluster
// through NATS: a pool whose only member is attached to edge A answers through edge B
// (forwarded edge to edge), and both edges list each other at /api/cluster.
func TestRunCluster(t *testing.T) {
	natsURL := startNATS(t)
	type edge struct {
		*runningEdge
		admin string
	}
	start := func(id string) edge {
		control, public, admin, peer := freePort(t), freePort(t), freePort(t), freePort(t)
		text := strings.Replace(edgeFile(control, public, oldToken, clusterTable(natsURL, id, peer, "")),
			"admin_port = 0", fmt.Sprintf("admin_port = %d", admin), 1)
		text = strings.Replace(text, "[limits]\n", "admin_token = \""+adminToken+"\"\n[load_balancing]\nenabled = true\n[limits]\n", 1)
		e := startRun(t, text, control, public)
		require.Contains(t, e.stderr.String(), `"listener":"peers"`)
		require.Contains(t, e.stderr.String(), `"msg":"edge joined the cluster","edge_id":"`+id+`"`)
		return edge{e, fmt.Sprintf("127.0.0.1:%d", admin)}
	}
	a, b := start("edge-a"), start("edge-b")

	backend := startBackend(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "on a") })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := tunnel.Dial(ctx, a.control, tunnel.WithToken(oldToken), tunnel.WithReconnect(false))
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: "app", Group: "app", GroupKey: "k"}, backend)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		status, body, err := get(b.public, "app.localhost", "/")
		return err == nil && status == 200 && body == "on a"
	}, 10*time.Second, 20*time.Millisecond, "edge B forwards to the member on edge A")

	var info struct {
		Edges []struct {
			ID string `json:"edge_id"`
		} `json:"edges"`
	}
	adminGet := func(addr string) []byte {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/cluster", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return body
	}
	for _, e := range []edge{a, b} {
		body := adminGet(e.admin)
		require.NoError(t, json.Unmarshal(body, &info), string(body))
		var ids []string
		for _, x := range info.Edges {
			ids = append(ids, x.ID)
		}
		require.ElementsMatch(t, []string{"edge-a", "edge-b"}, ids, string(body))
	}
	// SIGHUP with a changed [cluster]: reported as not applied, by the file's keys only.
	text, err := os.ReadFile(b.path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(b.path, bytes.Replace(text, []byte("lease_secs = 1\n"), []byte("lease_secs = 1\nreplicas = 3\n"), 1), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(b.stderr.String(), "configuration reloaded") && strings.Contains(a.stderr.String(), "configuration reloaded")
	}, 10*time.Second, 10*time.Millisecond, b.stderr.String())
	require.Contains(t, b.stderr.String(), "not applied: cluster.replicas (1 -> 3): the edge joined the cluster with it; restart the edge to apply it")
	require.Contains(t, b.stderr.String(), `"not_applied":1`)
	require.Contains(t, a.stderr.String(), `"not_applied":0`)
	status, body, err := get(b.public, "app.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 200, status, body)

	http.DefaultClient.CloseIdleConnections()
	sess.Close()
	for _, e := range []edge{b, a} {
		e.cancel()
		<-e.done
		require.Equal(t, 0, e.code, e.stderr.String())
	}
}
