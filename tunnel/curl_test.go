package tunnel

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCurlSpeaksHTTP2ToTheEdge: curl, a client the edge did not write, negotiates HTTP/2 by
// ALPN on the public HTTPS port and with prior knowledge on the HTTP port (Public.H2C), and
// gets the member's answer. Skipped when curl is not installed or has no HTTP/2.
func TestCurlSpeaksHTTP2ToTheEdge(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	if out, err := exec.Command(curl, "--version").Output(); err != nil || !strings.Contains(string(out), "HTTP2") {
		t.Skip("this curl has no HTTP/2")
	}
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{Public: PublicHTTP{H2C: true}})
	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "A").URL))
	require.NoError(t, err)

	run := func(addr, scheme string, args ...string) string {
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		args = append(args, "-sS", "--noproxy", "*", "--max-time", "5",
			"--resolve", "app."+testDomain+":"+port+":"+host,
			"-w", " %{http_version}", scheme+"://app."+testDomain+":"+port+"/hello")
		out, err := exec.CommandContext(ctx, curl, args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	require.Equal(t, "A /hello 2", run(httpsAddr, "https", "--http2", "-k"), "HTTP/2 by ALPN on the HTTPS port")
	require.Equal(t, "A /hello 2", run(e.publicAddr, "http", "--http2-prior-knowledge"), "h2c on the HTTP port")
	require.Equal(t, "A /hello 1.1", run(e.publicAddr, "http", "--http1.1"), "HTTP/1.1 still works")
}
