package health

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// MaxStatusLine is the most bytes an HTTP probe reads while looking for the
// end of the status line. A longer line fails the probe with
// [ErrMalformedStatusLine].
const MaxStatusLine = 1024

// Probe runs one probe of s (after [Spec.WithDefaults]) against target, a
// "host:port" address; target is ignored for TypeFunc. It returns nil when
// the target is healthy and an error saying why when it is not.
//
// The whole probe is bounded by s.Timeout and by ctx. An invalid spec or
// target is reported as an error wrapping [ErrInvalidSpec] or
// [ErrInvalidTarget]. For TypeFunc, Probe returns once the timeout expires
// even if Check ignores its context; such a Check keeps running in its own
// goroutine until it returns, and its result is discarded. A [Prober] keeps
// track of such calls; see there.
func (s Spec) Probe(ctx context.Context, target string) error {
	if ctx == nil {
		return errors.New("health: Probe called with a nil context")
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return err
	}
	if err := s.validateTarget(target); err != nil {
		return err
	}
	_, err := s.probe(ctx, target)
	return err
}

// probe runs one probe of a valid, defaulted spec. For TypeFunc, when Check
// did not return in time, running is a channel closed when it finally does;
// otherwise running is nil.
func (s Spec) probe(ctx context.Context, target string) (running <-chan struct{}, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	switch s.Type {
	case TypeTCP:
		return nil, probeTCP(ctx, target)
	case TypeHTTP:
		return nil, s.probeHTTP(ctx, target)
	default:
		return s.probeFunc(ctx)
	}
}

func probeTCP(ctx context.Context, target string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return err
	}
	_ = conn.Close()
	return nil
}

func (s Spec) probeHTTP(ctx context.Context, target string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return err
	}
	defer conn.Close()

	// The read and write are bounded by the probe's deadline; an earlier
	// cancellation of ctx moves the deadline into the past so that a
	// blocked read returns at once.
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return err
		}
	}
	stop := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-ctx.Done():
			_ = conn.SetDeadline(time.Unix(1, 0))
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		<-watcherDone
	}()

	host := target
	if h, port, err := net.SplitHostPort(target); err == nil && h == "" {
		host = net.JoinHostPort("localhost", port)
	}
	req := "GET " + s.Path + " HTTP/1.0\r\n" +
		"Host: " + host + "\r\n" +
		"User-Agent: warren-health\r\n" +
		"Connection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return fmt.Errorf("health: writing request: %w", err)
	}

	code, err := readStatusLine(conn)
	if err != nil {
		return err
	}
	if !s.AnyStatus && (code < 200 || code >= 300) {
		return fmt.Errorf("%w %d", ErrHTTPStatus, code)
	}
	return nil
}

// readStatusLine reads at most MaxStatusLine bytes from r, stopping at the
// first newline, and returns the status code of the HTTP status line found.
// It gives up early when the bytes read cannot start a status line.
func readStatusLine(r io.Reader) (int, error) {
	var buf [MaxStatusLine]byte
	n := 0
	for {
		m, err := r.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return parseStatusLine(buf[:i])
		}
		if !couldBeStatusLine(buf[:n]) {
			return 0, fmt.Errorf("%w %s", ErrMalformedStatusLine, quoteShort(buf[:n]))
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if n > 0 {
					// A status line cut short by the end of the stream.
					return parseStatusLine(buf[:n])
				}
				return 0, fmt.Errorf("%w: connection closed by peer", ErrNoStatusLine)
			}
			return 0, fmt.Errorf("%w: %w", ErrNoStatusLine, err)
		}
		if n == len(buf) {
			return 0, fmt.Errorf("%w: no end of line within %d bytes", ErrMalformedStatusLine, MaxStatusLine)
		}
	}
}

const httpPrefix = "HTTP/"

func couldBeStatusLine(b []byte) bool {
	k := min(len(b), len(httpPrefix))
	return string(b[:k]) == httpPrefix[:k]
}

// parseStatusLine parses `HTTP/<digits>[.<digits>] SP <3 digits> [SP reason]`,
// with an optional trailing CR, and returns the status code (100-599).
func parseStatusLine(line []byte) (int, error) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	bad := func() (int, error) {
		return 0, fmt.Errorf("%w %s", ErrMalformedStatusLine, quoteShort(line))
	}
	proto, rest, ok := bytes.Cut(line, []byte(" "))
	if !ok || !validProto(proto) {
		return bad()
	}
	codeText, _, _ := bytes.Cut(rest, []byte(" "))
	if len(codeText) != 3 {
		return bad()
	}
	code := 0
	for _, c := range codeText {
		if c < '0' || c > '9' {
			return bad()
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 || code > 599 {
		return bad()
	}
	return code, nil
}

func validProto(p []byte) bool {
	v, ok := bytes.CutPrefix(p, []byte(httpPrefix))
	if !ok {
		return false
	}
	major, minor, hasMinor := bytes.Cut(v, []byte("."))
	return allDigits(major) && (!hasMinor || allDigits(minor))
}

func allDigits(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// quoteShort quotes at most the first 64 bytes of b for an error message.
func quoteShort(b []byte) string {
	const limit = 64
	if len(b) > limit {
		return fmt.Sprintf("%q...", b[:limit])
	}
	return fmt.Sprintf("%q", b)
}

// probeFunc calls s.Check in its own goroutine so that a Check that ignores
// ctx cannot hold the probe past its deadline.
func (s Spec) probeFunc(ctx context.Context) (<-chan struct{}, error) {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = callCheck(ctx, s.Check)
	}()
	select {
	case <-done:
		return nil, err
	case <-ctx.Done():
	}
	select {
	case <-done: // it returned just in time
		return nil, err
	default:
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return done, fmt.Errorf("health: check did not return within %v: %w", s.Timeout, context.DeadlineExceeded)
	}
	return done, ctx.Err()
}

// callCheck turns a panic in check into an error, so that a buggy check
// fails its probe instead of crashing the process.
func callCheck(ctx context.Context, check func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("health: check panicked: %v", v)
		}
	}()
	return check(ctx)
}
