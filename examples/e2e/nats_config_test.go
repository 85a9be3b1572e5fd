package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/natsstore"
)

// natsConfigs are the example NATS cluster's node files, relative to this module.
var natsConfigs = []string{"../nats/nats-1.conf", "../nats/nats-2.conf", "../nats/nats-3.conf"}

// The example NATS configuration is what the cluster needs: JetStream that fsyncs before it
// acknowledges (sync_interval: always), a token, and three nodes that route to each other.
func TestExampleNATSConfigurationIsWhatTheClusterNeeds(t *testing.T) {
	for i, path := range natsConfigs {
		opts, err := natsserver.ProcessConfigFile(path)
		require.NoError(t, err, path)
		require.True(t, opts.JetStream, "%s: JetStream on", path)
		require.True(t, opts.SyncAlways, "%s: sync_interval: always", path)
		require.NotEmpty(t, opts.Authorization, "%s: a token", path)
		require.Equal(t, fmt.Sprintf("nats-%d", i+1), opts.ServerName)
		require.Len(t, opts.Routes, 2, "%s: routes to the two other nodes", path)
		for _, r := range opts.Routes {
			require.NotEqual(t, opts.Cluster.Host, r.Hostname(), "%s routes to itself", path)
			require.Equal(t, fmt.Sprint(opts.Cluster.Port), r.Port())
		}
	}
}

// The example NATS files run as a cluster of three nats-server processes (on 127.0.0.1 with
// ports of the test's own, their stores in its temporary directory): a bucket of three
// replicas is created on it, and a route written while one node is killed is read back.
func TestExampleNATSClusterKeepsRoutesWithANodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nats-server processes")
	}
	bin := natsServerBinary(t)
	ports := freePorts(t, 6)
	client := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	route := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[3+i]) }
	var procs []*exec.Cmd
	for i, path := range natsConfigs {
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		conf := string(src)
		for j := range natsConfigs {
			ip := fmt.Sprintf("127.0.0.%d", j+1)
			conf = strings.ReplaceAll(conf, ip+":4222", client(j))
			conf = strings.ReplaceAll(conf, ip+":6222", route(j))
		}
		conf = strings.Replace(conf, fmt.Sprintf("/var/lib/nats/nats-%d", i+1), t.TempDir(), 1)
		file := filepath.Join(t.TempDir(), filepath.Base(path))
		require.NoError(t, os.WriteFile(file, []byte(conf), 0o600))
		cmd := exec.Command(bin, "-c", file)
		require.NoError(t, cmd.Start())
		procs = append(procs, cmd)
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
	url := func(i int) string { return "nats://change-me-nats-token@" + client(i) }
	nc, err := nats.Connect(url(0)+","+url(1)+","+url(2), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var s *natsstore.Store
	require.Eventually(t, func() bool { // until the three nodes have met and elected a meta leader
		s, err = natsstore.Open(ctx, nc, natsstore.Config{Bucket: "routes", Replicas: 3, Timeout: 2 * time.Second})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "a bucket of three replicas: %v", err)
	defer s.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "routes")
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas)

	set := func(label, tenant string) error {
		_, err := s.Update(ctx, "http/"+label, func(*store.Route) (*store.Route, error) {
			return &store.Route{Kind: store.KindHTTP, Label: label, Tenant: tenant}, nil
		})
		return err
	}
	require.NoError(t, set("before", "acme"))
	require.NoError(t, procs[2].Process.Kill()) // one node of three: the others are a quorum
	_ = procs[2].Wait()
	require.Eventually(t, func() bool { return set("during", "acme") == nil }, 30*time.Second, 100*time.Millisecond,
		"a write with one node of three down")
	for _, label := range []string{"before", "during"} {
		r, err := s.Get(ctx, "http/"+label)
		require.NoError(t, err)
		require.NotNil(t, r, label)
		require.Equal(t, "acme", r.Tenant)
	}
}
