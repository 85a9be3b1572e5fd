package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

// domainProblem says why s is not a lowercase DNS host name, or returns "":
// at most 253 characters, not an IP address, and every label 1 to 63
// characters of a-z, 0-9 and "-", not starting or ending with "-" (the
// rule of public names, checked by [group.ValidateSubdomain]).
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
		if p := group.SubdomainProblem(label); p != "" {
			return fmt.Sprintf("%q is not a host name: label %s", s, p)
		}
	}
	return ""
}

// localLabel matches a label of a local host name: 1 to 63 letters,
// digits, "_" and "-", not starting or ending with "-".
var localLabel = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$`)

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
		if !localLabel.MatchString(label) {
			return fmt.Sprintf("%q is neither an IP address nor a host name", s)
		}
	}
	return ""
}

// hostPortProblem says why s is not "host:port", or returns "".
func hostPortProblem(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		reason := err.Error()
		if ae := (*net.AddrError)(nil); errors.As(err, &ae) {
			reason = ae.Err
		}
		return fmt.Sprintf("%q is not host:port (%s), e.g. \"tunnel.example.com:4040\"", s, reason)
	}
	if p := hostProblem(host); p != "" {
		return "host " + p
	}
	if _, err := parsePort(port); err != nil {
		return "port " + err.Error()
	}
	return ""
}

// natsURLProblem says why s is not the URL of a NATS server ("nats://host:port",
// tls://, ws:// or wss://, optionally with user:password), or returns "". The message
// leaves the URL out: it may hold credentials.
func natsURLProblem(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "is not a URL; write e.g. \"nats://10.0.0.1:4222\""
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Sprintf("scheme %q is not one of nats://, tls://, ws:// or wss:// (e.g. \"nats://10.0.0.1:4222\")", u.Scheme)
	}
	if u.Hostname() == "" {
		return "has no host; write e.g. \"nats://10.0.0.1:4222\""
	}
	if p := hostProblem(u.Hostname()); p != "" {
		return "host " + p
	}
	if u.Port() != "" {
		if _, err := parsePort(u.Port()); err != nil {
			return "port " + err.Error()
		}
	}
	return ""
}

// proxyURLProblem says why s is not the URL of a proxy the connector can go through
// (tunnel.WithProxy: http://, https://, socks5:// or socks5h://, optionally with
// user:password@, a host, an optional port, nothing more), or returns "". The message leaves
// the URL out: it may hold a password.
func proxyURLProblem(s string) string {
	const eg = ` (e.g. "http://proxy.example.com:3128" or "socks5://user:password@10.0.0.1:1080")`
	if !strings.Contains(s, "://") {
		return "has no scheme; start it with http://, https://, socks5:// or socks5h://" + eg
	}
	u, err := url.Parse(s)
	if err != nil {
		return "is not a URL" + eg
	}
	switch u.Scheme {
	case "http", "https", "socks5", "socks5h":
	default:
		return fmt.Sprintf("scheme %q is not one of http://, https://, socks5:// or socks5h://", u.Scheme) + eg
	}
	if u.Hostname() == "" {
		return "has no host" + eg
	}
	if p := hostProblem(u.Hostname()); p != "" {
		return "host " + p
	}
	if u.Port() != "" {
		if _, err := parsePort(u.Port()); err != nil {
			return "port " + err.Error()
		}
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "must be scheme://[user:password@]host[:port], without a path or query" + eg
	}
	return ""
}

// parsePort parses a decimal TCP port 1..65535.
func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	switch {
	case err != nil || s[0] < '0' || s[0] > '9' || len(s) > 5:
		return 0, fmt.Errorf("%q is not a port number (1-65535)", s)
	case n < 1 || n > 65535:
		return 0, fmt.Errorf("%d is out of range 1-65535", n)
	}
	return n, nil
}

// webhookProblem says why s cannot be an alert webhook URL, or returns ""
// (also for "", meaning none). The rules are the webhook package's own
// ([webhook.ValidateURL]: an absolute http or https URL with a host, at
// most webhook.MaxURLLength bytes), plus a valid port. Like that package,
// the message leaves the URL out: its path or query may hold a secret.
func webhookProblem(s string) string {
	hint := fmt.Sprintf(" (use an absolute http:// or https:// URL of at most %d bytes)", webhook.MaxURLLength)
	if s == "" {
		return ""
	}
	if err := webhook.ValidateURL(s); err != nil {
		return strings.TrimPrefix(err.Error(), "webhook: ") + hint
	}
	if u, _ := url.Parse(s); u.Port() != "" {
		if _, err := parsePort(u.Port()); err != nil {
			return "invalid port: " + err.Error() + hint
		}
	}
	return ""
}

// seconds is a duration written as a number of seconds: an integer or a
// fraction.
type seconds float64

// maxSeconds is the longest duration a *_secs key may hold.
const maxSeconds = float64(math.MaxInt64 / int64(time.Second))

// duration stores secs seconds into dst. The sign is left to validation.
func (r *reporter) duration(key string, secs float64, dst *time.Duration) {
	switch {
	case math.IsNaN(secs) || math.IsInf(secs, 0):
		r.fail(key, ErrInvalid, "must be a finite number of seconds, got %s", formatSeconds(secs))
	case math.Abs(secs) > maxSeconds:
		r.fail(key, ErrInvalid, "%s seconds is too long", formatSeconds(secs))
	case secs != 0 && math.Round(secs*float64(time.Second)) == 0:
		r.fail(key, ErrInvalid, "%s seconds is below the 1ns resolution", formatSeconds(secs))
	default:
		*dst = time.Duration(math.Round(secs * float64(time.Second)))
	}
}

func formatSeconds(s float64) string { return strconv.FormatFloat(s, 'g', -1, 64) }

func formatDuration(d time.Duration) string { return formatSeconds(d.Seconds()) }

var durationType, secondsType = reflect.TypeFor[time.Duration](), reflect.TypeFor[seconds]()

// describeType names what a value of Go type t is written as; table is the
// format's word for a table ("a table" or "a mapping").
func describeType(t reflect.Type, table string) string {
	if t == durationType || t == secondsType {
		return "a number of seconds"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return describeType(t.Elem(), table)
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array"
	case reflect.Struct, reflect.Map:
		return table
	}
	return "a value of type " + t.String()
}

// resolvePath makes a relative path relative to dir (the directory of the
// configuration file); dir "" leaves it relative to the working directory.
func resolvePath(dir, p string) string {
	if p == "" || dir == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// checkFile reports why path cannot be used as a file, or "" (also for "",
// meaning none).
func checkFile(path string) string {
	fi, err := os.Stat(path)
	switch {
	case path == "":
	case err != nil:
		return fmt.Sprintf("cannot use %q: %v", path, unwrapPathError(err))
	case fi.IsDir():
		return fmt.Sprintf("%q is a directory, not a file", path)
	}
	return ""
}

func unwrapPathError(err error) error {
	if pe := (*os.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// maxFileSize bounds the configuration text accepted. Real files are a few
// kilobytes; the bound keeps a wrong path (a log, a binary) or a hostile
// document from costing much time.
const maxFileSize = 256 << 10

// sizeError reports text larger than maxFileSize, or returns nil.
func sizeError(file string, n int) error {
	if n <= maxFileSize {
		return nil
	}
	return ErrorList{{File: file, Msg: fmt.Sprintf("the file is larger than %d bytes; is this the right file?", maxFileSize), Err: ErrInvalid}}
}

// readTimeout bounds the reading of a configuration file.
const readTimeout = 5 * time.Second

// readFile reads a configuration file of at most maxFileSize bytes.
func readFile(path string) ([]byte, error) {
	// Opened without waiting, and read within readTimeout: a FIFO or a device at path would
	// otherwise keep the reader (a SIGHUP's reload) waiting for a writer for ever. A regular
	// file takes no deadline, and needs none.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	var data []byte
	if err == nil {
		defer f.Close()
		_ = f.SetReadDeadline(time.Now().Add(readTimeout))
		data, err = io.ReadAll(io.LimitReader(f, maxFileSize+1))
	}
	if err != nil {
		return nil, ErrorList{{File: path, Msg: "cannot read the configuration file: " + unwrapPathError(err).Error(), Err: err}}
	}
	if err := sizeError(path, len(data)); err != nil {
		return nil, err
	}
	return data, nil
}
