package config_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

const clusterToken = "cluster-token-0123456789"

// TestClusterAbsent: without [cluster] the edge is a single edge.
func TestClusterAbsent(t *testing.T) {
	c, err := config.ParseServer("server.toml", []byte(serverDoc("")))
	require.NoError(t, err)
	require.Nil(t, c.Cluster)
}

// TestClusterDefaults: a minimal [cluster] gets every default: peer_addr is advertise,
// lease 10 s, bucket "warren", 1 replica, timeout 5 s, no TLS, edge_id left to the host name.
func TestClusterDefaults(t *testing.T) {
	c, err := config.ParseServer("server.toml", []byte(serverDoc(`[cluster]
nats_urls = ["nats://10.0.0.1:4222", "tls://nats-2.internal:4222"]
advertise = "10.0.0.5:7443"
token = "`+clusterToken+`"
`)))
	require.NoError(t, err)
	require.Equal(t, &config.Cluster{
		NATSURLs:  []string{"nats://10.0.0.1:4222", "tls://nats-2.internal:4222"},
		Advertise: "10.0.0.5:7443",
		PeerAddr:  "10.0.0.5:7443",
		Token:     clusterToken,
		LeaseTTL:  10 * time.Second,
		Bucket:    "warren",
		Replicas:  1,
		Timeout:   5 * time.Second,
	}, c.Cluster)
	require.False(t, c.Cluster.TLS.Enabled())
}

// TestClusterEveryKey: every key of [cluster] and [cluster.tls] is read; relative TLS
// paths are relative to the file's directory.
func TestClusterEveryKey(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"peer.crt", "peer.key", "ca.pem"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600))
	}
	path := filepath.Join(dir, "server.toml")
	require.NoError(t, os.WriteFile(path, []byte(serverDoc(`[cluster]
nats_urls = ["nats://127.0.0.1:4222"]
edge_id = "edge_a-1"
advertise = "edge-a.internal:7443"
peer_addr = ":7443"
token = "`+clusterToken+`"
lease_secs = 2.5
bucket = "prod"
replicas = 3
timeout_secs = 1
[cluster.tls]
cert_path = "peer.crt"
key_path = "peer.key"
ca_path = "ca.pem"
`)), 0o600))
	c, err := config.LoadServer(path)
	require.NoError(t, err)
	require.Equal(t, &config.Cluster{
		NATSURLs:  []string{"nats://127.0.0.1:4222"},
		EdgeID:    "edge_a-1",
		Advertise: "edge-a.internal:7443",
		PeerAddr:  ":7443",
		Token:     clusterToken,
		LeaseTTL:  2500 * time.Millisecond,
		Bucket:    "prod",
		Replicas:  3,
		Timeout:   time.Second,
		TLS: config.ClusterTLS{CertPath: filepath.Join(dir, "peer.crt"), KeyPath: filepath.Join(dir, "peer.key"),
			CAPath: filepath.Join(dir, "ca.pem")},
	}, c.Cluster)
	require.True(t, c.Cluster.TLS.Enabled())
}

// TestClusterPeerPort: peer_port = N listens on port N of [server] bind, like every other
// *_port, so that two edges on one host (bind 127.0.0.1 and 127.0.0.2) can both take it; it is
// checked like peer_addr and cannot be given with it.
func TestClusterPeerPort(t *testing.T) {
	base := "[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nadvertise = \"10.0.0.5:7443\"\ntoken = \"" + clusterToken + "\"\n"
	c, err := config.ParseServer("server.toml", []byte(serverDoc(base+"peer_port = 7444\n")))
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0:7444", c.Cluster.PeerAddr, "the default bind")
	require.Equal(t, 7444, c.Cluster.PeerPort)
	c, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nbind = \"127.0.0.2\"\n"+base+"peer_port = 7444\n"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.2:7444", c.Cluster.PeerAddr)

	const head = "[server]\ndomain = \"localhost\"\n" // lines 1-2; [cluster] on 3, peer_port on 7
	for _, tc := range []struct {
		extra string
		want  want
	}{
		{"peer_port = 4040\n", want{7, "cluster.peer_port", config.ErrInvalid, "port 4040 is already used by server.control_port"}},
		{"peer_port = 70000\n", want{7, "cluster.peer_port", config.ErrInvalid, "70000 is out of range 1-65535"}},
		{"peer_port = 0\n", want{7, "cluster.peer_port", config.ErrInvalid, "port 0 is out of range 1-65535"}},
		{"peer_port = 7444\npeer_addr = \"10.0.0.5:7445\"\n", want{7, "cluster.peer_port", config.ErrInvalid, "cannot be combined with cluster.peer_addr (line 8): give one of them"}},
	} {
		_, err := config.ParseServer("server.toml", []byte(head+base+tc.extra))
		requireProblems(t, err, "server.toml", tc.want)
	}
}

// TestClusterErrors: each bad [cluster] value is refused with its file, line and key.
func TestClusterErrors(t *testing.T) {
	const head = "[server]\ndomain = \"localhost\"\n" // lines 1-2
	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		{"empty table", head + "[cluster]\n", []want{
			{3, "cluster.nats_urls", config.ErrRequired, "required: the NATS servers"},
			{3, "cluster.advertise", config.ErrRequired, "required: the host:port the other edges reach"},
			{3, "cluster.token", config.ErrRequired, "required: the secret every edge"},
		}},
		{"with state_dir", "[server]\ndomain = \"localhost\"\nstate_dir = \"/var/lib/warren\"\n[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nadvertise = \"127.0.0.1:7443\"\ntoken = \"" + clusterToken + "\"\n",
			[]want{{3, "server.state_dir", config.ErrInvalid, "cannot be combined with [cluster] (line 4): a cluster keeps route ownership in NATS"}}},
		{"bad values", head + `[cluster]
nats_urls = ["http://127.0.0.1:4222", "nats://:4222", "nats://user:secret@127.0.0.1:99999"]
edge_id = "edge a"
advertise = "10.0.0.5"
peer_addr = "127.0.0.1:4040"
token = "short"
lease_secs = 0.1
bucket = "a.b"
replicas = 7
timeout_secs = 0
`, []want{
			{4, "cluster.nats_urls[0]", config.ErrInvalid, `scheme "http" is not one of nats://`},
			{4, "cluster.nats_urls[1]", config.ErrInvalid, "has no host"},
			{4, "cluster.nats_urls[2]", config.ErrInvalid, "port 99999 is out of range"},
			{5, "cluster.edge_id", config.ErrInvalid, `"edge a" may hold only letters, digits`},
			{6, "cluster.advertise", config.ErrInvalid, `"10.0.0.5" is not host:port`},
			{7, "cluster.peer_addr", config.ErrInvalid, "port 4040 is already used by server.control_port"},
			{8, "cluster.token", config.ErrInvalid, "is 5 characters long; a token needs at least 16"},
			{9, "cluster.lease_secs", config.ErrInvalid, "must be at least 300ms, got 100ms"},
			{10, "cluster.bucket", config.ErrInvalid, `"a.b" may hold only letters`},
			{11, "cluster.replicas", config.ErrInvalid, "must be at most 5 (JetStream's limit), got 7"},
			{12, "cluster.timeout_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"},
		}},
		{"token shared with a connector", head + "[auth]\ntokens = [\"" + clusterToken + "\"]\n[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nadvertise = \"127.0.0.1:7443\"\ntoken = \"" + clusterToken + "\"\n",
			[]want{{8, "cluster.token", config.ErrInvalid, "the same token is already used by auth.tokens[0] (line 4)"}}},
		{"wrong types and unknown keys", head + "[cluster]\nnats_urls = \"nats://127.0.0.1:4222\"\nadvertise = \"127.0.0.1:7443\"\ntoken = \"" + clusterToken + "\"\nlease_sec = 3\n[cluster.tls]\ncert = \"x\"\n",
			[]want{
				{4, "cluster.nats_urls", config.ErrType, "expected an array of strings, got a string"},
				{7, "cluster.lease_sec", config.ErrUnknownKey, `did you mean "lease_secs"?`},
				{9, "cluster.tls.cert", config.ErrUnknownKey, "unknown key"},
			}},
		{"tls halves", head + "[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nadvertise = \"127.0.0.1:7443\"\ntoken = \"" + clusterToken + "\"\n[cluster.tls]\nca_path = \"/nonexistent/ca.pem\"\n",
			[]want{
				{8, "cluster.tls.ca_path", config.ErrInvalid, "needs cluster.tls.cert_path and key_path"},
				{8, "cluster.tls.ca_path", config.ErrInvalid, `cannot use "/nonexistent/ca.pem"`},
			}},
		{"tls key without cert", head + "[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nadvertise = \"127.0.0.1:7443\"\ntoken = \"" + clusterToken + "\"\n[cluster.tls]\nkey_path = \"/nonexistent/k.pem\"\n",
			[]want{
				{7, "cluster.tls.cert_path", config.ErrRequired, "required when cluster.tls.key_path is set"},
				{8, "cluster.tls.key_path", config.ErrInvalid, `cannot use "/nonexistent/k.pem"`},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseServer("server.toml", []byte(tc.doc))
			requireProblems(t, err, "server.toml", tc.wants...)
		})
	}
}

// TestClusterSecretsStayOut: neither the cluster token nor the credentials of a NATS URL
// appear in an error message.
func TestClusterSecretsStayOut(t *testing.T) {
	_, err := config.ParseServer("server.toml", []byte(serverDoc(`[cluster]
nats_urls = ["ftp://admin:hunter2-secret@127.0.0.1:4222"]
advertise = "127.0.0.1:7443"
token = "tooshortsecret"
`)))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2-secret")
	require.NotContains(t, err.Error(), "tooshortsecret")
}

// TestClusterValidateInGo: Validate checks a [cluster] built in Go.
func TestClusterValidateInGo(t *testing.T) {
	c, err := config.ParseServer("server.toml", []byte(serverDoc(`[cluster]
nats_urls = ["nats://127.0.0.1:4222"]
advertise = "127.0.0.1:7443"
token = "`+clusterToken+`"
`)))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	c.Cluster.Replicas = 0
	c.Cluster.Advertise = ""
	requireProblems(t, c.Validate(), "server.toml",
		want{0, "cluster.advertise", config.ErrRequired, "required"},
		want{0, "cluster.replicas", config.ErrInvalid, "must be 1 to 5, got 0"})
}

// TestClusterSample: the commented [cluster] block of server.example.toml, uncommented,
// is a valid configuration (with its TLS paths left empty).
func TestClusterSample(t *testing.T) {
	data, err := os.ReadFile(serverSample)
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	in := false
	key := regexp.MustCompile(`^# ([a-z_]+ = |\[cluster)`)
	n := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "# [cluster]") {
			in = true
		}
		if in && key.MatchString(l) {
			lines[i] = strings.TrimPrefix(l, "# ")
			n++
		}
	}
	require.Equal(t, 14, n, "uncommented lines")
	c, err := config.ParseServer("server.toml", []byte(strings.Join(lines, "\n")))
	require.NoError(t, err)
	require.NotNil(t, c.Cluster)
	require.Len(t, c.Cluster.NATSURLs, 3)
	require.Equal(t, "10.0.0.11:7443", c.Cluster.PeerAddr)
	require.Equal(t, 10*time.Second, c.Cluster.LeaseTTL)
}
