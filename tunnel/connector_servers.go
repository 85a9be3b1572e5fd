package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"
)

// DialServers connects a connector to the first edge of addrs ("host:port" each) that
// answers, and returns the session. Use it when several edges serve the same pools (a
// cluster): when the connection is lost, the session connects to another of them and
// registers its tunnels there.
//
// It is a function of its own rather than an option of Dial because the list is what the
// session is about: every edge in it is an equal alternative (none is the "main" one), and
// its first connection keeps trying where Dial's gives up after one attempt.
//
// The edges are tried in order, each attempt bounded by the dial and handshake timeouts;
// a host name that resolves to several addresses stands for each of them, in the resolver's
// order, dialled one after the other (names are resolved again before each pass; the TLS
// server name stays the host name; with WithDialer, the dialer gets the names as given and
// resolves them itself). When a whole pass fails, DialServers waits the backoff delay (WithBackoff) and
// starts again, until an edge answers or ctx ends: give ctx a deadline. A refused token or
// protocol version ends it at once, as with Dial; any other refusal moves on to the next
// edge.
//
// Once connected, a lost connection is retried from the edge after the one that was lost
// (wrapping around), so that a dead edge is not the first one dialled again; the backoff
// delay applies between passes that all failed, and before the lost edge is dialled again.
// Session.Server says which edge the session is attached to; each move to another edge is
// logged.
//
// An empty addrs, or an empty address in it, is refused with an error wrapping ErrInvalid.
func DialServers(ctx context.Context, addrs []string, opts ...Option) (*Session, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("tunnel: DialServers needs at least one edge address: %w", ErrInvalid)
	}
	for i, a := range addrs {
		if strings.TrimSpace(a) == "" {
			return nil, fmt.Errorf("tunnel: edge address %d of %d is empty: %w", i+1, len(addrs), ErrInvalid)
		}
	}
	return dial(ctx, append([]string(nil), addrs...), true, opts)
}

// Server returns the address of the edge the session is attached to, as it was given to
// Dial or DialServers ("host:port"), or, while it reconnects, of the edge it was attached to
// last. ServerAddr says which address of a host name was dialled.
func (s *Session) Server() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edge.server
}

// ServerAddr returns the network address of the edge the session is attached to (or was
// last): the address the host name of Server resolved to, or Server itself when it was not
// resolved (an IP address, a lookup that failed, a dialer set with WithDialer, or an edge
// reached through a proxy, which resolves it).
func (s *Session) ServerAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edge.addr
}

// Proxy names the proxy through which the session reaches the edge it is attached to (or
// was last), as scheme://host:port without credentials, or returns "" for a direct
// connection (see WithProxy).
func (s *Session) Proxy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return proxyName(s.edge.proxy)
}

// candidate is one address a session may connect to: an edge address as given, or one of
// the addresses its host name resolved to.
type candidate struct {
	server string // as given to Dial or DialServers, "host:port"
	addr   string // the address dialled: server, or a resolved "ip:port"
	host   string // the host of server: the TLS server name
	index  int    // the position of server in Session.servers
	// proxy is the proxy the edge is reached through (nil: directly); addr is then server,
	// for the proxy to resolve.
	proxy *url.URL
}

// String names the candidate in logs and errors: "a.example:4040 (192.0.2.1:4040)".
func (c candidate) String() string {
	if c.addr == c.server {
		return c.server
	}
	return c.server + " (" + c.addr + ")"
}

// same reports whether c and o are the same edge address.
func (c candidate) same(o candidate) bool { return c.server == o.server && c.addr == o.addr }

func (s *Session) setEdge(c candidate) {
	s.mu.Lock()
	s.edge = c
	s.mu.Unlock()
}

func (s *Session) currentEdge() candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edge
}

// candidates returns the list one pass tries, in order: for each edge address, the
// addresses its host name resolves to, or the address itself when its host is an IP
// address, when the session does not resolve names (a dialer set with WithDialer resolves
// them itself) or when the lookup fails (the dialer then reports why). Duplicates are
// dropped.
func (s *Session) candidates(ctx context.Context) []candidate {
	var out []candidate
	seen := map[string]bool{}
	add := func(c candidate) {
		if !seen[c.addr] {
			seen[c.addr] = true
			out = append(out, c)
		}
	}
	for i, server := range s.servers {
		var proxy *url.URL
		if s.opts.proxyFor != nil {
			proxy = s.opts.proxyFor(server)
		}
		host, port, err := net.SplitHostPort(server)
		if err != nil {
			add(candidate{server: server, addr: server, index: i, proxy: proxy}) // the dialer says what is wrong
			continue
		}
		base := candidate{server: server, addr: server, host: host, index: i, proxy: proxy}
		if _, err := netip.ParseAddr(host); err == nil || s.opts.lookup == nil || proxy != nil {
			add(base)
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, s.opts.attemptTimeout)
		ips, err := s.opts.lookup(lctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			s.log.Debug("edge address did not resolve; dialling it by name", zap.String("server", server), zap.Error(err))
			add(base)
			continue
		}
		for _, ip := range ips {
			c := base
			c.addr = net.JoinHostPort(ip, port)
			add(c)
		}
	}
	return out
}

// connectPass tries each candidate once, in order, and returns the first connection made.
// With after set, it starts with the candidate after that one (wrapping around), so that
// after is tried last, and calls beforeAfter first (false: ctx ended). failed is called
// with each failed attempt.
//
// A refused token or protocol version ends the pass at once with fatal set. A dialer that
// answers ErrServerClosed (a closed in-memory edge) only ends the session when every
// candidate of the pass answers it. Otherwise err holds every attempt's error.
func (s *Session) connectPass(ctx context.Context, after *candidate, beforeAfter func() bool,
	failed func(candidate, error)) (_ *clientConn, _ candidate, err error, fatal bool) {
	cands := s.candidates(ctx)
	start := 0
	if after != nil {
		start = rotation(cands, *after)
	}
	var errs []error
	closed := 0
	for k := range cands {
		cand := cands[(start+k)%len(cands)]
		if after != nil && beforeAfter != nil && cand.same(*after) && !beforeAfter() {
			return nil, cand, ctx.Err(), false
		}
		actx, cancel := context.WithTimeout(ctx, s.opts.attemptTimeout)
		c, err := s.connect(actx, cand)
		cancel()
		if err == nil {
			return c, cand, nil, false
		}
		switch {
		case errors.Is(err, ErrServerClosed):
			closed++
		case permanent(err):
			return nil, cand, err, true
		}
		if ctx.Err() != nil {
			return nil, cand, err, false
		}
		if failed != nil {
			failed(cand, err)
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return nil, cands[0], errs[0], closed == len(cands)
	}
	return nil, candidate{}, &passError{errs: errs}, closed == len(cands)
}

// rotation returns where a pass that must try after last starts: just after it, or, when a
// new lookup no longer lists it, at the first address of the next edge.
func rotation(cands []candidate, after candidate) int {
	for i, c := range cands {
		if c.same(after) {
			return (i + 1) % len(cands)
		}
	}
	for i, c := range cands {
		if c.index > after.index {
			return i
		}
	}
	return 0
}

// connectFirst makes the session's first connection: one pass (Dial), or passes with the
// backoff delay between them until one succeeds, a refusal is fatal or ctx ends
// (DialServers).
func (s *Session) connectFirst(ctx context.Context, retry bool) (*clientConn, candidate, error) {
	for attempt := 0; ; attempt++ {
		c, cand, err, fatal := s.connectPass(ctx, nil, nil, func(cd candidate, err error) {
			if retry {
				s.log.Info("connect failed", zap.Int("attempt", attempt), zap.String("server", cd.String()), zap.Error(err))
			}
		})
		switch {
		case err == nil:
			return c, cand, nil
		case fatal || !retry:
			return nil, cand, err
		case ctx.Err() != nil:
			return nil, cand, fmt.Errorf("tunnel: no edge answered before %w: %w", ctx.Err(), err)
		}
		if !sleepCtx(ctx, s.backoff(attempt)) {
			return nil, cand, fmt.Errorf("tunnel: no edge answered before %w: %w", ctx.Err(), err)
		}
	}
}

// passError is a pass in which every edge failed; it holds each attempt's error.
type passError struct{ errs []error }

func (e *passError) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("tunnel: no edge answered (%d tried): %s", len(e.errs), strings.Join(msgs, "; "))
}

func (e *passError) Unwrap() []error { return e.errs }

// sleepCtx waits d, or less when ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
