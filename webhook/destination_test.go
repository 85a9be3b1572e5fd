package webhook

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDestinationsOperatorAndTwoTenants(t *testing.T) {
	got := Destinations("https://ops.example/hook", []string{"https://a.example/x", "https://b.example/y"})
	require.Equal(t, []Destination{
		{URL: "https://ops.example/hook", Trusted: true},
		{URL: "https://a.example/x"},
		{URL: "https://b.example/y"},
	}, got)
}

func TestDestinationsDeduplicatesInFirstSeenOrder(t *testing.T) {
	tenants := []string{
		"https://b.example/y",
		"",
		"https://a.example/x",
		"https://b.example/y", // two members of one tenant share a URL
		"https://ops.example/hook",
		"  ",
		"https://a.example/x",
	}
	want := []Destination{
		{URL: "https://ops.example/hook", Trusted: true},
		{URL: "https://b.example/y"},
		{URL: "https://a.example/x"},
	}
	require.Equal(t, want, Destinations("https://ops.example/hook", tenants))
	// Stable: same input, same order.
	require.Equal(t, want, Destinations("https://ops.example/hook", tenants))
}

func TestDestinationsWithoutOperator(t *testing.T) {
	got := Destinations("", []string{"https://a.example/x", "https://a.example/x"})
	require.Equal(t, []Destination{{URL: "https://a.example/x"}}, got)
	require.Empty(t, Destinations("", nil))
}

func TestValidateURL(t *testing.T) {
	for _, ok := range []string{
		"https://hooks.slack.com/services/T000/B000/XXXX",
		"http://127.0.0.1:8080/alert",
		"HTTPS://Example.COM",
		"http://[::1]:9/x?y=z",
	} {
		require.NoError(t, ValidateURL(ok), ok)
	}
	long := "https://example.com/" + string(make([]byte, MaxURLLength))
	for _, bad := range []string{
		"",
		"hooks.slack.com/services/x",
		"/relative/path",
		"ftp://example.com/x",
		"file:///etc/passwd",
		"javascript:alert(1)",
		"http://",
		"https:///path-only",
		"http:example.com",
		"http://exa mple.com/",
		"http://example.com:port/",
		long,
	} {
		err := ValidateURL(bad)
		require.Error(t, err, bad)
		require.True(t, errors.Is(err, ErrInvalidURL), bad)
	}
}

func TestValidateURLErrorDoesNotEchoSecret(t *testing.T) {
	err := ValidateURL("ftp://example.com/services/SECRET")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "SECRET")
}

func TestRedact(t *testing.T) {
	require.Equal(t, "https://hooks.slack.com", redact("https://hooks.slack.com/services/SECRET?token=x"))
	require.Equal(t, "http://127.0.0.1:80", redact("http://user:pw@127.0.0.1:80/p"))
	require.Equal(t, "<invalid url>", redact("::"))
}
