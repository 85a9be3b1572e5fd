package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/warren-tunnel/warren/tunnel"
)

// heavyPackages are what an app that embeds only a connector must not link: the edge's
// cluster (NATS), its file store (bbolt), its admin plane (Prometheus, and protobuf through
// it), gRPC and QUIC (quic-go). Package tunnel imports none of them; the edge's example wires
// them in.
var heavyPackages = []string{
	"github.com/nats-io/",
	"go.etcd.io/bbolt",
	"github.com/prometheus/",
	"google.golang.org/protobuf",
	"google.golang.org/grpc",
	"github.com/quic-go/", // the QUIC transport: only programs that import tunnel/quic link it
}

// maxBinaryBytes bounds this program's size, unstripped, on linux/amd64 with Go 1.26
// (measured 9.69 MB; the connector linking the whole edge was 13.9 MB). What it links
// besides Warren is most of it: a program that only serves net/http weighs 8.37 MB with Go
// 1.26.8, 8.78 MB with encoding/json (the control protocol's frames are JSON) and 8.96 MB with
// zap as well; Warren, yamux and a TLS client add the rest. The bound keeps it there: a
// change that drags the edge's dependencies back in adds megabytes.
const maxBinaryBytes = 10_000_000

// TestConnectorOnlyProgramIsSmall builds this program and checks what it links and its size.
func TestConnectorOnlyProgramIsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program")
	}
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range heavyPackages {
			require.False(t, strings.HasPrefix(pkg, heavy), "a connector-only program links %s", pkg)
		}
	}
	bin := filepath.Join(t.TempDir(), "backend")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	fi, err := os.Stat(bin)
	require.NoError(t, err)
	t.Logf("connector-only program: %d bytes unstripped (linux/amd64)", fi.Size())
	require.LessOrEqual(t, fi.Size(), int64(maxBinaryBytes), "the connector-only program grew")
}

// A program that does not link the QUIC transport refuses to use it, naming the import that
// would: asking for it costs no megabytes until then.
func TestQUICWithoutTheImportIsRefused(t *testing.T) {
	_, err := tunnel.Dial(context.Background(), "127.0.0.1:1", tunnel.WithQUIC())
	require.ErrorIs(t, err, tunnel.ErrInvalid)
	require.ErrorContains(t, err, `import _ "github.com/warren-tunnel/warren/tunnel/quic"`)
}
