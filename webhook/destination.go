package webhook

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// MaxURLLength is the longest webhook URL ValidateURL accepts, in bytes.
const MaxURLLength = 2048

// ErrInvalidURL is returned (wrapped) by ValidateURL for a URL that is not an
// absolute http or https URL with a host.
var ErrInvalidURL = errors.New("webhook: invalid URL")

// Destination is one URL an alert is POSTed to.
type Destination struct {
	// URL is the absolute http or https URL to POST to.
	URL string
	// Trusted is true only for the operator URL configured on the edge.
	// Untrusted (tenant) destinations are refused when they resolve to an
	// address that is not globally reachable (see ErrRefused), their
	// redirects are not followed, and a Sender bounds how many of them it
	// tracks.
	Trusted bool
}

// Destinations returns the fan-out list for one alert: the operator URL first
// (if non-empty, Trusted), followed by the unique non-empty tenant URLs in
// first-seen order. A tenant URL equal to the operator URL is not repeated, so
// every URL receives a single POST per alert. URLs are compared as exact
// strings; blank entries are skipped.
func Destinations(operatorURL string, tenantURLs []string) []Destination {
	dests := make([]Destination, 0, 1+len(tenantURLs))
	seen := make(map[string]struct{}, 1+len(tenantURLs))
	if strings.TrimSpace(operatorURL) != "" {
		dests = append(dests, Destination{URL: operatorURL, Trusted: true})
		seen[operatorURL] = struct{}{}
	}
	for _, u := range tenantURLs {
		if strings.TrimSpace(u) == "" {
			continue
		}
		if _, dup := seen[u]; dup {
			continue
		}
		seen[u] = struct{}{}
		dests = append(dests, Destination{URL: u})
	}
	return dests
}

// ValidateURL accepts only absolute http or https URLs with a host and at
// most MaxURLLength bytes. The edge uses it to reject a bad tenant
// alert_webhook at registration; errors wrap ErrInvalidURL and never echo the
// URL's path or query (which may hold a secret).
func ValidateURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("%w: empty", ErrInvalidURL)
	}
	if len(raw) > MaxURLLength {
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidURL, MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: cannot be parsed", ErrInvalidURL)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%w: scheme must be http or https", ErrInvalidURL)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return fmt.Errorf("%w: missing host", ErrInvalidURL)
	}
	return nil
}

// redact returns only the scheme and host of raw, for logs and errors: tenant
// URLs often carry a secret in their path or query.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "<invalid url>"
	}
	return u.Scheme + "://" + u.Host
}
