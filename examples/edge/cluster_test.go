package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/cluster"
	"github.com/warren-tunnel/warren/tunnel/config"
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

// writeCert writes a self-signed certificate for 127.0.0.1 and its key into dir.
func writeCert(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath = filepath.Join(dir, "peer.crt"), filepath.Join(dir, "peer.key")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	return certPath, keyPath
}

// TestServerConfigCluster: [cluster] maps onto cluster.Config, TLS files loaded; without it
// the edge has no cluster.
func TestServerConfigCluster(t *testing.T) {
	sc, err := serverConfig(parse(t, "[server]\ndomain = \"localhost\"\n"), zap.NewNop())
	require.NoError(t, err)
	require.Nil(t, sc.Cluster)

	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	path := filepath.Join(dir, "server.toml")
	require.NoError(t, os.WriteFile(path, []byte(`[server]
domain = "localhost"
[cluster]
nats_urls = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
edge_id = "edge-a"
advertise = "localhost:7443"
peer_addr = ":7443"
token = "`+clusterToken+`"
lease_secs = 3
bucket = "prod"
replicas = 3
timeout_secs = 2
[cluster.tls]
cert_path = "peer.crt"
key_path = "peer.key"
ca_path = "peer.crt"
`), 0o600))
	c, err := config.LoadServer(path)
	require.NoError(t, err)
	sc, err = serverConfig(c, zap.NewNop())
	require.NoError(t, err)
	require.IsType(t, &cluster.Cluster{}, sc.Cluster)
	cc, err := clusterConfig(c.Cluster)
	require.NoError(t, err)
	require.Equal(t, []string{"nats://10.0.0.1:4222", "nats://10.0.0.2:4222"}, cc.NATSURLs)
	require.Equal(t, "edge-a", cc.EdgeID)
	require.Equal(t, "localhost:7443", cc.Advertise)
	require.Equal(t, ":7443", cc.PeerAddr)
	require.Equal(t, clusterToken, cc.Token)
	require.Equal(t, 3*time.Second, cc.LeaseTTL)
	require.Equal(t, "prod", cc.Bucket)
	require.Equal(t, 3, cc.Replicas)
	require.Equal(t, 2*time.Second, cc.Timeout)
	require.NotNil(t, cc.PeerTLS)
	require.Len(t, cc.PeerTLS.Certificates, 1)
	require.NotNil(t, cc.PeerClientTLS)
	require.NotNil(t, cc.PeerClientTLS.RootCAs)

	// A key pair that does not load is refused, naming the file and the table.
	require.NoError(t, os.WriteFile(key, []byte("not a key"), 0o600))
	_, err = serverConfig(c, zap.NewNop())
	require.ErrorContains(t, err, path+": cluster: tls: loading cert_path and key_path")
	require.NoError(t, os.WriteFile(cert, []byte("x"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"-check", "-config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), path+": cluster: tls")
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

// TestReloadCluster: a changed [cluster] is reported as not applied, key by key, the token
// without its values.
func TestReloadCluster(t *testing.T) {
	const base = "[server]\ndomain = \"localhost\"\n"
	single := parse(t, base)
	one := parse(t, base+clusterTable("nats://127.0.0.1:4222", "a", 7443, ""))
	two := parse(t, base+strings.Replace(clusterTable("nats://127.0.0.1:4223", "a", 7443, "replicas = 3\n"), clusterToken, "other-edges-secret-0123", 1))
	require.Empty(t, fileDiff(one, one))
	require.Equal(t, []string{"cluster (off -> on): the edge runs alone; restart the edge to join the cluster"}, fileDiff(single, one))
	require.Equal(t, []string{"cluster (on -> off): the edge stays in the cluster; restart the edge to run it alone"}, fileDiff(one, single))
	diff := fileDiff(one, two)
	require.Equal(t, []string{
		"cluster.nats_urls ([nats://127.0.0.1:4222] -> [nats://127.0.0.1:4223]): the edge joined the cluster with it; restart the edge to apply it",
		"cluster.token: the edge joined the cluster with it; restart the edge to apply it",
		"cluster.replicas (1 -> 3): the edge joined the cluster with it; restart the edge to apply it",
	}, diff)
	require.NotContains(t, strings.Join(diff, "\n"), "secret")

	three := parse(t, base+strings.Replace(clusterTable("nats://127.0.0.1:4222", "a", 7443, "[cluster.tls]\nca_path = \"\"\n"), "lease_secs = 1", "lease_secs = 2", 1))
	require.Equal(t, []string{"cluster.lease_secs (1s -> 2s): the edge joined the cluster with it; restart the edge to apply it"}, fileDiff(one, three))
}
