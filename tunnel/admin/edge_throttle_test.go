package admin

// Token checks of a Plane over a live edge: its limiter of failed authentications is the
// control listener's (moved from package tunnel's throttle_test.go), and New refuses a short
// admin token (the check admin.New makes of Options.Token).

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// dialFrom connects to addr from the loopback address ip (127.0.0.0/8 all lives on lo).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// helloFrom says hello with token from the loopback address ip and returns the edge's answer:
// a Welcome or an Error. A welcomed session stays open until the test ends.
func helloFrom(t *testing.T, ip, addr, token string) wire.Message {
	t.Helper()
	sess, err := yamux.Client(dialFrom(t, ip, addr), mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	ctrl, err := sess.OpenStream()
	require.NoError(t, err)
	_ = ctrl.SetDeadline(time.Now().Add(10 * time.Second))
	// The edge may answer and close before yamux reports the write done, which yamux then
	// reports as failed: the answer, read below, tells.
	_ = wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version, Token: token})
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	return m
}

func requireErrorCode(t *testing.T, m wire.Message, code string) *wire.Error {
	t.Helper()
	e, ok := m.(*wire.Error)
	require.True(t, ok, "want an %s error, got %#v", code, m)
	require.Equal(t, code, e.Code, e.Message)
	return e
}

// New refuses an admin token shorter than tunnel.MinTokenLength characters (not bytes).
func TestShortAdminTokenIsRefused(t *testing.T) {
	srv := newServer(t, tunnel.ServerConfig{})
	_, err := New(srv, Options{Token: "s3cret"})
	require.EqualError(t, err, "admin: the admin token is 6 characters long; a token needs at least 16")
	_, err = New(srv, Options{Token: "ééééééééééééééé"})
	require.ErrorContains(t, err, "15 characters long", "counted in characters, not bytes")
	p, err := New(srv, Options{Token: "0123456789abcdef"})
	require.NoError(t, err)
	p.Close()
	p, err = New(srv, Options{})
	require.NoError(t, err, "no token: an open API")
	p.Close()
}

// Guessing the admin token on the admin API blocks the address on the control port too.
func TestAdminTokenGuessingBlocksTheControlPort(t *testing.T) {
	const good = "good-connector-token"
	e := startEdge(t, tunnel.ServerConfig{Auth: mustStaticTokens(t, []string{good}, nil),
		PreAuth: tunnel.PreAuthLimits{MaxAuthFailuresPerIP: 2, AuthFailureDelay: -1}}, Options{Token: "admin-token-0123456789"})
	api := newAPIClient(t, e.adminAddr)
	for range 2 {
		requireError(t, api, "admin-token-guess-00", "/api/groups", http.StatusUnauthorized)
	}
	requireError(t, api, "admin-token-0123456789", "/api/groups", http.StatusTooManyRequests)
	requireErrorCode(t, helloFrom(t, "127.0.0.1", e.ControlAddr, good), wire.CodeUnavailable)
	require.IsType(t, &wire.Welcome{}, helloFrom(t, "127.0.0.3", e.ControlAddr, good))
}

// Guessing tokens on the control port blocks the address on the admin API too, the admin
// token included (the admin part of package tunnel's TestControlTokenGuessingIsThrottled).
func TestControlTokenGuessingBlocksTheAdminAPI(t *testing.T) {
	const good = "good-connector-token"
	e := startEdge(t, tunnel.ServerConfig{Auth: mustStaticTokens(t, []string{good}, nil),
		PreAuth: tunnel.PreAuthLimits{MaxAuthFailuresPerIP: 3, AuthFailureDelay: 100 * time.Millisecond}}, Options{Token: "admin-token-0123456789"})
	for i := range 3 {
		requireErrorCode(t, helloFrom(t, "127.0.0.1", e.ControlAddr, "guess-"+string(rune('a'+i))), wire.CodeUnauthorized)
	}
	requireErrorCode(t, helloFrom(t, "127.0.0.1", e.ControlAddr, good), wire.CodeUnavailable)

	// The admin listener shares the count.
	api := newAPIClient(t, e.adminAddr)
	code, h, body := api.get("admin-token-0123456789", "/api/tunnels")
	require.Equal(t, http.StatusTooManyRequests, code, string(body))
	require.Equal(t, "900", h.Get("Retry-After"))
}
