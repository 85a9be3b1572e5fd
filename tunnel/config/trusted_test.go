package config_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// TestTrustedProxies: [server] trusted_proxies holds CIDR prefixes; each one that is not
// is reported with its line and index, a bare address with the prefix to write instead.
func TestTrustedProxies(t *testing.T) {
	cfg, err := config.ParseServer("server.toml", []byte(serverDoc("trusted_proxies = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.7/32\"]\n")))
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.7/32"}, cfg.Server.TrustedProxies)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("192.0.2.7/32")}, edgeOf(t, serverDoc("trusted_proxies = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.7/32\"]\n")).Config.Public.TrustedProxies)

	cfg, err = config.ParseServer("server.toml", []byte(serverDoc("")))
	require.NoError(t, err)
	require.Empty(t, cfg.Server.TrustedProxies, "none by default")

	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		{"bad cidr", serverDoc("trusted_proxies = [\n  \"10.0.0.0/8\",\n  \"10.0.0.300/8\",\n]\n"),
			[]want{{5, "server.trusted_proxies[1]", config.ErrInvalid, `"10.0.0.300/8" is not a CIDR prefix such as "10.0.0.0/8"`}}},
		{"bare address", serverDoc("trusted_proxies = [\"203.0.113.7\", \"::1\"]\n"),
			[]want{{3, "server.trusted_proxies[0]", config.ErrInvalid, `for this one address write "203.0.113.7/32"`},
				{3, "server.trusted_proxies[1]", config.ErrInvalid, `for this one address write "::1/128"`}}},
		{"prefix too long", serverDoc("trusted_proxies = [\"10.0.0.0/33\"]\n"),
			[]want{{3, "server.trusted_proxies[0]", config.ErrInvalid, "not a CIDR prefix"}}},
		{"not a list", serverDoc("trusted_proxies = \"10.0.0.0/8\"\n"),
			[]want{{3, "server.trusted_proxies", config.ErrType, "expected an array"}}},
		{"not strings", serverDoc("trusted_proxies = [10]\n"),
			[]want{{3, "server.trusted_proxies[0]", config.ErrType, "expected a string, got an integer"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseServer("server.toml", []byte(tc.doc))
			require.Nil(t, cfg)
			requireProblems(t, err, "server.toml", tc.wants...)
		})
	}
}
