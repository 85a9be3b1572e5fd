package proxy

import (
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const testDomain = "warren.test"

func TestSubdomainOf(t *testing.T) {
	cases := map[string]string{
		"app.warren.test":       "app",
		"APP.Warren.Test:8080":  "app",
		"app.warren.test.":      "app",
		"a.b.warren.test":       "",
		"warren.test":           "",
		".warren.test":          "",
		"appwarren.test":        "",
		"app.warren.test.evil":  "",
		"[::1]:80":              "",
		"":                      "",
		"app.other.test":        "",
		"x-y-1.warren.test:443": "x-y-1",
	}
	for host, want := range cases {
		got, ok := subdomainOf(host, testDomain)
		require.Equal(t, want != "", ok, host)
		require.Equal(t, want, got, host)
	}
}

// FuzzSubdomainOf: the Host parser never panics, and what it accepts is exactly one DNS
// label in front of the domain.
func FuzzSubdomainOf(f *testing.F) {
	for _, h := range []string{"app.warren.test", "APP.Warren.Test:8080", "a.b.warren.test", "warren.test", "[::1]:80",
		"app.warren.test.", ".warren.test", "app.warren.test:99999", "ä.warren.test", "\x00.warren.test"} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, host string) {
		sub, ok := subdomainOf(host, testDomain)
		if !ok {
			if sub != "" {
				t.Fatalf("rejected %q but returned %q", host, sub)
			}
			return
		}
		if sub == "" || strings.ContainsAny(sub, ".:") || strings.ToLower(sub) != sub {
			t.Fatalf("accepted %q as subdomain %q", host, sub)
		}
		h := host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		if !strings.EqualFold(strings.TrimSuffix(h, "."), sub+"."+testDomain) {
			t.Fatalf("%q is not %q under %q", host, sub, testDomain)
		}
	})
}
