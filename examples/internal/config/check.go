package config

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// labelProblem says why s is not a DNS label (a-z, 0-9 and "-", 1 to 63
// characters, no leading or trailing "-"), or returns "".
func labelProblem(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return fmt.Sprintf("is %d characters long; at most 63 are allowed", len(s))
	case s[0] == '-' || s[len(s)-1] == '-':
		return fmt.Sprintf("%q must not start or end with \"-\"", s)
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
		case r >= 'A' && r <= 'Z':
			return fmt.Sprintf("%q must be lowercase", s)
		default:
			return fmt.Sprintf("%q may only hold a-z, 0-9 and \"-\" (found %q)", s, r)
		}
	}
	return ""
}

// domainProblem says why s is not a lowercase DNS host name, or returns "".
func domainProblem(s string) string {
	if len(s) > 253 {
		return fmt.Sprintf("is %d characters long; a host name has at most 253", len(s))
	}
	if strings.ToLower(s) != s {
		return fmt.Sprintf("%q must be lowercase", s)
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return fmt.Sprintf("%q is an IP address; public URLs need a DNS name such as \"localhost\" or \"tunnel.example.com\"", s)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" {
			return fmt.Sprintf("%q is not a host name: it has an empty label", s)
		}
		if p := labelProblem(label); p != "" {
			return fmt.Sprintf("%q is not a host name: label %s", s, p)
		}
	}
	return ""
}

// hostProblem says why s is neither an IP address nor a host name, or
// returns "". Host names are checked loosely (any case, "_" allowed) since
// they only need to resolve on the local network.
func hostProblem(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return ""
	}
	if len(s) > 253 {
		return fmt.Sprintf("is %d characters long; a host name has at most 253", len(s))
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Sprintf("%q is neither an IP address nor a host name", s)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Sprintf("%q is neither an IP address nor a host name", s)
			}
		}
	}
	return ""
}

// webhookProblem says why s is not an absolute http or https URL, or
// returns "".
func webhookProblem(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Sprintf("%q is not a URL: %v", s, unwrapURLError(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("%q must be an absolute http:// or https:// URL", s)
	case u.Opaque != "" || u.Hostname() == "":
		return fmt.Sprintf("%q has no host", s)
	}
	if p := u.Port(); p != "" {
		if _, err := parsePort(p); err != nil {
			return fmt.Sprintf("%q has an invalid port: %v", s, err)
		}
	}
	return ""
}

func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// parsePort parses a decimal TCP port 1..65535.
func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, fmt.Errorf("%q is not a port number (1-65535)", s)
	}
	n := 0
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q is not a port number (1-65535)", s)
		}
		n = n*10 + int(r-'0')
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%d is out of range 1-65535", n)
	}
	return n, nil
}
