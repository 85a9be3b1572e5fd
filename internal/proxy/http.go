package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// HTTP is the public HTTP ingress, an http.Handler: it routes each request by its Host
// header (<subdomain>.<Domain>) to a group and proxies it to one member, per request, over a
// pooled keep-alive stream; the group's affinity, if it has one, chooses the member, and a
// failed attempt may go to one other member (see the package documentation). Before
// anything else, an HTTP/2 request whose header list is over Config.MaxHeaderBytes gets
// 431, a CONNECT 405, an HTTP/2 request whose :path holds a space 400. Unknown hosts get
// 404, a group with no selectable member 503, a backend that fails mid-request 502; a Host
// with a bad port (not 0-65535) and a malformed request body get 400, a request body that
// arrives too slowly (Config.RequestBodyTimeout, Config.RequestBodyMinRate) 408. A gRPC
// call gets each of these answers as a gRPC status (HTTP.fail, grpcerr.go). Once a
// response has started, any of these failures aborts the client's connection instead of
// ending the response cleanly (the http.ErrAbortHandler panic of httputil.ReverseProxy
// under an http.Server): a body with a Content-Length ends short, a chunked one without
// its last chunk. Each request carries the
// edge's forwarding headers (Config.TrustedProxies, forwarded.go), and an Expect:
// 100-continue reaches the backend, which decides whether the client's body is read
// (memberConn.roundTrip; net/http's transport for h2c members), unless the edge already
// holds the whole body for a replay. A request whose client already went away is not
// dispatched; no 1xx response is relayed to an HTTP/1.0 client, and at most
// maxInterimResponses to others.
type HTTP struct {
	cfg   Config
	proxy *httputil.ReverseProxy
	// stalls holds the budgets of the responses whose client is not keeping up (stall.go).
	stalls *stallLedger
}

// reqInfoKey carries a public request's *reqInfo in its context, from ServeHTTP to the
// member transport and the error handler.
type reqInfoKey struct{}

// reqInfo is what ServeHTTP learnt of a public request, for the member transport and the
// error handler: one context value instead of one per item (each costs an allocation and a
// longer walk on every lookup).
type reqInfo struct {
	g    *group.Group
	aff  *affinity   // the group's affinity for the request, or nil
	body *publicBody // the public request body, or nil
	// watch is the response's stall watch (stall.go), or nil when the edge watches none.
	watch *stallWatch
}

// infoOf returns the reqInfo in ctx, or nil.
func infoOf(ctx context.Context) *reqInfo {
	ri, _ := ctx.Value(reqInfoKey{}).(*reqInfo)
	return ri
}

// reqCtx is a public request's context carrying its reqInfo: what context.WithValue and a
// separate reqInfo would be, in one allocation instead of two. Everything but the value of
// reqInfoKey is its parent's (cancellation, deadline, the values of other keys), and
// context's own functions (AfterFunc, WithCancel) find the parent's cancellation through
// Value, as they do through a WithValue context.
type reqCtx struct {
	context.Context
	ri reqInfo
	// sw is the response's stall watch, kept here for the same reason.
	sw stallWatch
}

// Value implements context.Context.
func (c *reqCtx) Value(key any) any {
	if _, ok := key.(reqInfoKey); ok {
		return &c.ri
	}
	return c.Context.Value(key)
}

// String names the context, as context.WithValue's does, for a panic or a log line.
func (c *reqCtx) String() string { return "proxy.reqCtx" }

// AffinityCookie is the cookie that keeps a client on one member of a group with "cookie"
// affinity: its value is the member's group.Member.AffinityToken.
const AffinityCookie = "warren_affinity"

// affinityOf returns how the affinity setting a steers the pick for r (as the client sent
// it), or nil for a plain pick: "cookie" by r's AffinityCookie (and the response hands out a
// new one when another member serves), "client_ip" by r's remote address, "header:<Name>" by
// the header's value, when r has it.
func affinityOf(a string, r *http.Request) *affinity {
	switch a {
	case group.AffinityCookie:
		aff := &affinity{cookie: true, secure: r.TLS != nil}
		if c, err := r.Cookie(AffinityCookie); err == nil {
			aff.token = c.Value
		}
		return aff
	case group.AffinityClientIP:
		if ip := clientAddr(r.RemoteAddr); ip.IsValid() {
			return keyedBy(ip.String())
		}
		return nil
	}
	if name, ok := strings.CutPrefix(a, group.AffinityHeaderPrefix); ok {
		if v := r.Header.Get(name); v != "" {
			return keyedBy(v)
		}
	}
	return nil
}

// setAffinityCookie hands out m's affinity token on resp, unless the request carried it.
func setAffinityCookie(resp *http.Response, m *group.Member, a *affinity) {
	tok := m.AffinityToken()
	if tok == "" || tok == a.token {
		return
	}
	v := AffinityCookie + "=" + tok + "; Path=/; HttpOnly; SameSite=Lax"
	if a.secure {
		v += "; Secure"
	}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	resp.Header.Add("Set-Cookie", v)
}

// NewHTTP returns the HTTP ingress configured by cfg.
func NewHTTP(cfg Config) *HTTP {
	cfg.setDefaults()
	h := &HTTP{cfg: cfg, stalls: newStallLedger(cfg.StalledBytesPerConn, cfg.StalledBytesPerClient, cfg.StalledBytes)}
	trusted := newTrustedProxies(cfg.TrustedProxies)
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Host
			pr.Out.Host = pr.In.Host
			// Forwarded, X-Forwarded-*, X-Real-IP: the edge's own, or a trusted proxy's
			// chain with the peer appended (forwarded.go). Set here, they reach HTTP/1.1
			// and h2c members alike.
			setForwarding(pr, trusted)
			// Expect: 100-continue stays: an h2c member's transport waits for the backend's
			// 100 before it sends the body, and so does an HTTP/1.1 member's exchange
			// (memberConn.roundTrip).
			keepTrailers(pr.In, pr.Out)
		},
		Transport:    &memberTransport{cfg: &h.cfg},
		BufferPool:   copyBufPool{},
		ErrorHandler: h.proxyError,
		ErrorLog:     zap.NewStdLog(cfg.Logger.Named("proxy")),
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serve(w, r, nil) }

// routed is what GuardTLSRoutes learnt of a request's route, for ServeHTTP not to work it
// out again: its subdomain (ok false when its Host names none) and the group of that
// subdomain when it was looked up (nil: none).
type routed struct {
	sub string
	ok  bool
	g   *group.Group
}

// serve is ServeHTTP; rt, when not nil, is the request's route as GuardTLSRoutes found it.
func (h *HTTP) serve(w http.ResponseWriter, r *http.Request, rt *routed) {
	var watch *stallWatch
	defer func() { h.endResponse(w, r, watch) }()
	if isH2CPreface(r) {
		// A client speaking HTTP/2 with prior knowledge to a listener that does not: it
		// is told so in HTTP/2, instead of being given a 404 it cannot read.
		refuseH2C(w)
		return
	}
	h.cfg.Stats.HTTPRequests.Add(1)
	if h.refuseBeforeRouting(w, r) {
		return
	}
	var sub string
	var ok bool
	if rt != nil {
		sub, ok = rt.sub, rt.ok
	} else {
		sub, ok = subdomainOf(r.Host, h.cfg.Domain)
	}
	if !ok {
		h.fail(w, r, fmt.Sprintf("no tunnel for host %q", r.Host), http.StatusNotFound)
		return
	}
	done, admitted := h.admit(w, r, sub)
	if !admitted {
		return
	}
	if done != nil {
		defer done()
	}
	var g *group.Group
	if rt != nil {
		g = rt.g
	} else {
		g = h.cfg.Registry.LookupHTTP(sub)
	}
	if g == nil {
		h.failNoGroup(w, r, sub)
		return
	}
	if g.Proto == group.ProtoHTTPS && r.TLS == nil && h.redirectToHTTPS(w, r, sub) {
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		// The body is wrapped below, on a copy of the request: the server judges the
		// connection by the body it handed out (an Expect: 100-continue body not read to
		// its end, a body it closed early: the connection is not reused).
		r = r.WithContext(r.Context())
		if !h.prepareBody(w, r) {
			return
		}
	}
	rc := &reqCtx{Context: r.Context(), ri: reqInfo{g: g}}
	ri := &rc.ri
	var ctx context.Context = rc
	if d, ok := grpcTimeout(r); ok {
		ctx = context.WithValue(ctx, grpcDeadlineKey{}, time.Now().Add(d))
	}
	if g.Affinity != "" {
		ri.aff = affinityOf(g.Affinity, r)
	}
	if r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		// The body is forwarded while the response comes back (a backend may answer before
		// it read the whole upload, or stream both ways): the server must not consume the
		// rest of the body itself when the response starts.
		_ = rc.EnableFullDuplex()
		body := newPublicBody(r.Body, rc, &h.cfg)
		r.Body = body
		ri.body = body
		// A body cut short is closed before returning, as the server would after: in
		// full-duplex mode net/http would then read a rest of it that it holds buffered,
		// which starts its watch for the next request while it is about to read that
		// request itself (a panic: "invalid concurrent Body.Read call"). The read deadline
		// the abort set makes this Close quick; nothing else reads the body any more then
		// (the member's exchange waited for its writer).
		defer func() {
			if body.cutShort() {
				_ = body.Close()
			}
		}()
	}
	// At most maxInterimResponses 1xx responses before the final one: an HTTP/1.1 member's
	// exchange counts them itself (memberConn.readResponse), an h2c member's has a hook of
	// its own (h2Exchange.roundTrip). (A hook here, for every request, cost a reflect-made
	// function and four allocations per request, in httptrace's composing of hooks.)
	var out http.ResponseWriter = w
	if !r.ProtoAtLeast(1, 1) {
		// No 1xx response to an HTTP/1.0 client (RFC 9110 §15.2): it would take it for
		// the final one.
		out = http10Writer{w}
	}
	if h.watchesStalls() {
		watch = &rc.sw
		watch.start(h, out, r.RemoteAddr)
		ri.watch = watch
		out = watch
	}
	h.proxy.ServeHTTP(out, r.WithContext(ctx))
}

// refuseBeforeRouting answers r, and reports true, when it is refused whatever its route:
// an HTTP/2 header list over the limit, CONNECT, a space in an HTTP/2 request target, a
// Host with a bad port.
func (h *HTTP) refuseBeforeRouting(w http.ResponseWriter, r *http.Request) bool {
	if r.ProtoMajor == 2 && h.cfg.MaxHeaderBytes > 0 && h2HeaderListSize(r) > h.cfg.MaxHeaderBytes+h2HeaderSlack {
		h.fail(w, r, fmt.Sprintf("request header fields over the limit of %d bytes", h.cfg.MaxHeaderBytes), http.StatusRequestHeaderFieldsTooLarge)
		return true
	}
	if r.Method == http.MethodConnect {
		h.refuseConnect(w, r)
		return true
	}
	if r.ProtoMajor == 2 && strings.IndexByte(r.RequestURI, ' ') >= 0 {
		// An HTTP/2 :path may hold a space, which net/http's HTTP/2 server lets through
		// (its query is kept raw): written into the request line to an HTTP/1.1 member
		// ("GET /x?a=1 HTTP/1.0 HTTP/1.1"), it would end the target there and make the
		// rest the backend's protocol version. Refused as net/http refuses such a request
		// line over HTTP/1.1.
		h.fail(w, r, "bad request: a space in the request target", http.StatusBadRequest)
		return true
	}
	if !validHostPort(r.Host) {
		h.fail(w, r, fmt.Sprintf("invalid port in host %q", r.Host), http.StatusBadRequest)
		return true
	}
	return false
}

// admit applies the admission policy of subdomain sub (Config.HTTPGate), if it has one, to
// r. admitted is false when r is refused: it has been answered. done, when not nil, is
// called at the end of r.
func (h *HTTP) admit(w http.ResponseWriter, r *http.Request, sub string) (done func(), admitted bool) {
	if h.cfg.HTTPGate == nil {
		return nil, true
	}
	gate := h.cfg.HTTPGate(sub)
	if gate == nil {
		return nil, true
	}
	done, refused := gate.Admit(clientAddr(r.RemoteAddr))
	if refused != nil {
		if refused.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(refused.RetryAfter.Seconds())))
		}
		h.fail(w, r, refused.Reason, refused.Status)
		return nil, false
	}
	return done, true
}

// failNoGroup answers a request for subdomain sub, which no group serves: 503 when sub is a
// reserved endpoint (Config.Reserved), 404 otherwise.
func (h *HTTP) failNoGroup(w http.ResponseWriter, r *http.Request, sub string) {
	if h.cfg.Reserved != nil && h.cfg.Reserved(sub) {
		h.fail(w, r, fmt.Sprintf("no healthy backend for %s", r.Host), http.StatusServiceUnavailable)
		return
	}
	h.fail(w, r, fmt.Sprintf("no tunnel for host %q", r.Host), http.StatusNotFound)
}

// redirectToHTTPS answers r, a plain-HTTP request for subdomain sub of an https group, with
// a permanent redirect to the group's HTTPS host, and reports whether it did (it does not
// when the group has no HTTPS host here).
func (h *HTTP) redirectToHTTPS(w http.ResponseWriter, r *http.Request, sub string) bool {
	host := h.cfg.HTTPSHost(sub)
	if host == "" {
		return false
	}
	u := *r.URL
	u.Scheme, u.Host = "https", host
	if isGRPC(r) {
		// A gRPC client follows no redirect: it is told where the service is.
		h.fail(w, r, fmt.Sprintf("%s is served over HTTPS only: %s", r.Host, u.String()), http.StatusPermanentRedirect)
		return true
	}
	http.Redirect(w, r, u.String(), http.StatusPermanentRedirect)
	return true
}

// prepareBody readies the body of r, a request with one, for forwarding: on HTTP/2, the
// Expect: 100-continue its server took off is put back, and the body is capped at
// Config.RequestBodyMaxBytes. It reports false when r announced a body over that limit:
// it has been answered 413.
func (h *HTTP) prepareBody(w http.ResponseWriter, r *http.Request) bool {
	if r.ProtoMajor == 2 && h2ExpectsContinue(r.Body) {
		// net/http's HTTP/2 server takes Expect: 100-continue off the request (and answers
		// it on the body's first read): it is put back for the member, whose exchange then
		// waits for its backend's 100 before it reads the body.
		r.Header = r.Header.Clone()
		r.Header.Set("Expect", "100-continue")
	}
	if max := h.cfg.RequestBodyMaxBytes; max > 0 {
		if r.ContentLength > max {
			h.fail(w, r, fmt.Sprintf("request body over the limit of %d bytes", max), http.StatusRequestEntityTooLarge)
			return false
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	return true
}

// watchesStalls reports whether responses are watched for clients that do not keep up: a
// stall timeout or a budget is set.
func (h *HTTP) watchesStalls() bool {
	c := &h.cfg
	return c.ResponseStallTimeout > 0 || c.StalledBytesPerConn > 0 || c.StalledBytesPerClient > 0 || c.StalledBytes > 0
}

// h2HeaderSlack is what net/http's HTTP/2 server adds to MaxHeaderBytes for its header list
// limit: 32 bytes for each of 10 fields, as HTTP/2 counts 32 bytes more for each.
const h2HeaderSlack = 10 * 32

// h2HeaderListSize is the size of an HTTP/2 request's header list as RFC 7541 counts it, and
// net/http's HTTP/2 server against its limit: each field's name and value and 32 bytes,
// the pseudo-header fields included.
func h2HeaderListSize(r *http.Request) int {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	n := len(":method") + len(r.Method) + len(":scheme") + len(scheme) + len(":authority") + len(r.Host) +
		len(":path") + len(r.RequestURI) + 4*32
	for k, vv := range r.Header {
		for _, v := range vv {
			n += len(k) + len(v) + 32
		}
	}
	return n
}

// allowedMethods is the Allow header of the edge's 405 to CONNECT: every method but CONNECT
// goes to the backend.
const allowedMethods = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, TRACE"

// refuseConnect answers a CONNECT request 405, before any member is involved. The edge is a
// reverse proxy, not a forward one (as Caddy and nginx, which refuse it alike): relaying
// CONNECT as an ordinary request carried the backend's answer back but not the client's
// bytes, and left the member's stream open once the client had sent some and gone. An
// HTTP/1.x connection is closed after the answer: a client that did not wait for it may
// already have sent tunnel bytes, which must not be read as its next request.
func (h *HTTP) refuseConnect(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", allowedMethods)
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	h.fail(w, r, "CONNECT is not supported: this is a reverse proxy, not a forward proxy", http.StatusMethodNotAllowed)
}

// errTooManyInterim fails a request whose backend sent maxInterimResponses 1xx responses
// without a final one.
var errTooManyInterim = fmt.Errorf("proxy: backend sent %d interim responses without a final one", maxInterimResponses)

// interimLimit returns a Got1xxResponse hook that fails the request at its backend's
// maxInterimResponses-th 1xx response.
func interimLimit() func(int, textproto.MIMEHeader) error {
	var n atomic.Int32
	return func(int, textproto.MIMEHeader) error {
		if n.Add(1) >= maxInterimResponses {
			return errTooManyInterim
		}
		return nil
	}
}

// http10Writer is the ResponseWriter of an HTTP/1.0 client's request: the backend's 1xx
// responses are not relayed.
type http10Writer struct{ http.ResponseWriter }

func (w http10Writer) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the server's own ResponseWriter.
func (w http10Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// SweepIdle closes the pooled streams of every member that have been idle for longer than
// Config.IdleStreamTimeout at now, and lets the others drop their receive buffers. The edge
// calls it now and then.
func (h *HTTP) SweepIdle(now time.Time) {
	cutoff := now.Add(-h.cfg.IdleStreamTimeout)
	for _, g := range h.cfg.Registry.Groups() {
		for _, m := range g.Members() {
			if t, ok := m.Value().(*Tunnel); ok {
				t.pool.sweep(cutoff)
				if t.h2 != nil {
					t.h2.sweep()
				}
			}
		}
	}
}

// Janitor calls SweepIdle every interval until done is closed.
func (h *HTTP) Janitor(interval time.Duration, done <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			h.SweepIdle(now)
		}
	}
}

// bodyAborter returns a func that ends a blocked read of req's public body (or does nothing).
func bodyAborter(req *http.Request) func() {
	if ri := infoOf(req.Context()); ri != nil && ri.body != nil {
		return ri.body.abort
	}
	return func() {}
}

func (h *HTTP) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		mbe *http.MaxBytesError
		bte *bodyTimeoutError
		rbe *requestBodyError
	)
	// closeConn closes an HTTP/1.x connection after this answer, when the rest of a request
	// body may still come. An HTTP/2 stream needs nothing of it (the server resets the
	// stream), and Connection: close would make the server end the whole connection
	// (GOAWAY), every other request on it included.
	closeConn := func() {
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
	}
	if ri := infoOf(r.Context()); ri != nil && ri.body != nil && ri.body.cutShort() {
		// The upload was cut short: the rest of the body may still come, and the
		// connection cannot carry another request.
		closeConn()
	}
	switch {
	case errors.Is(err, ErrNoMember):
		if ri := infoOf(r.Context()); ri != nil && ri.g.Saturated() {
			w.Header().Set("Retry-After", "1")
			h.fail(w, r, fmt.Sprintf("every backend for %s is at its concurrency limit", r.Host), http.StatusServiceUnavailable)
			return
		}
		h.fail(w, r, fmt.Sprintf("no healthy backend for %s", r.Host), http.StatusServiceUnavailable)
	case errors.As(err, &mbe):
		h.fail(w, r, fmt.Sprintf("request body over the limit of %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
	case errors.As(err, &bte):
		// The rest of the body may still come: the connection cannot carry another request.
		closeConn()
		// The answer is a sentence for the public client: no package prefix.
		h.fail(w, r, strings.TrimPrefix(bte.Error(), "proxy: "), http.StatusRequestTimeout)
	case r.Context().Err() != nil:
		// The client went away; nobody reads this answer.
		h.fail(w, r, "", http.StatusBadGateway)
	case errors.As(err, &rbe):
		h.cfg.Logger.Debug("bad request body", zap.String("host", r.Host), zap.Error(err))
		closeConn()
		h.fail(w, r, "bad request: "+strings.TrimPrefix(rbe.Error(), "proxy: "), http.StatusBadRequest)
	default:
		h.cfg.Logger.Debug("proxy error", zap.String("host", r.Host), zap.Error(err))
		h.fail(w, r, "bad gateway: the tunnel's backend failed", http.StatusBadGateway)
	}
}

// validHostPort reports whether the port of a Host header, if it has one, is a decimal
// number from 0 to 65535 (an empty port, "host:", is allowed as RFC 3986 allows it).
func validHostPort(host string) bool {
	if strings.IndexByte(host, ':') < 0 {
		return true // no port (net.SplitHostPort would fail it, allocating its error)
	}
	_, port, err := net.SplitHostPort(host)
	if err != nil || port == "" {
		return true // no port (a host that is not host:port is judged by subdomainOf)
	}
	if len(port) > 5 {
		return false
	}
	n := 0
	for _, c := range []byte(port) {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n <= 65535
}

// subdomainOf returns the single label in front of domain in host, lower-cased; host may carry
// a port and a trailing dot.
func subdomainOf(host, domain string) (string, bool) {
	// A host without ':' has no port (net.SplitHostPort would fail it, allocating its
	// error: twice a request, as validHostPort asks too).
	if strings.IndexByte(host, ':') >= 0 {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	host = strings.TrimSuffix(host, ".")
	if len(host) <= len(domain)+1 || host[len(host)-len(domain)-1] != '.' ||
		!strings.EqualFold(host[len(host)-len(domain):], domain) {
		return "", false
	}
	sub := strings.ToLower(host[:len(host)-len(domain)-1])
	if sub == "" || strings.ContainsAny(sub, ".:") { // a host with a bare ':' is no DNS name
		return "", false
	}
	return sub, true
}

// memberTransport is the reverse proxy's RoundTripper: it dispatches each request to one
// member of the group in the request's context and carries it over a pooled stream.
type memberTransport struct{ cfg *Config }

// RoundTrip implements http.RoundTripper.
func (t *memberTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ri := infoOf(req.Context())
	if ri == nil {
		return nil, ErrNoMember
	}
	g := ri.g
	if err := req.Context().Err(); err != nil {
		// The client went away (an HTTP/2 stream it reset at once): no member hears of it.
		return nil, err
	}
	// rp holds the body of a replayable request, for one more attempt.
	rp, err := t.replayOf(req, g)
	if err != nil {
		return nil, err
	}
	p := &picker{g: g, retries: t.cfg.Stats.RetriesOpenFailed, outcome: t.cfg.Outcome, aff: ri.aff, ctx: req.Context()}
	pc, m, err := t.conn(p, req)
	if err != nil {
		return nil, err
	}
	resp, err := t.attempt(pc, m, req, ri)
	if err == nil || req.Context().Err() != nil {
		return resp, err
	}
	bodyless := req.Body == nil || req.Body == http.NoBody
	var retries *atomic.Uint64
	var oe *openError
	switch {
	case errors.As(err, &oe):
		// The member's connector refused the new stream the request went out on (or closed
		// or reset it unacknowledged): it discarded every byte of it, and the edge holds
		// what it sent (memberConn.readAck). The request goes to one other member, if the
		// retry is unspent, as if the open had failed.
		body, ok := resendBody(pc, req, rp)
		if !ok {
			return nil, err
		}
		t.cfg.Logger.Debug("member refused the stream; trying another member",
			zap.String("host", req.Host), zap.String("tunnel", pc.tunnel().id), zap.Error(err))
		pc2, m2, err2 := t.conn(p, req)
		if err2 != nil {
			return nil, err
		}
		t.cfg.Stats.RetriesOpenFailed.Add(1)
		req.Body = body
		return t.attempt(pc2, m2, req, ri)
	case errors.Is(err, errUnread) && t.cfg.RetryUnreadRequests && bodyless:
		// The member's backend reset its connection with the request unread (it died or
		// dropped its queue): no byte of it reached a handler, and having no body it can be
		// sent again, to one other member if the retry is unspent.
		t.cfg.Logger.Debug("backend reset the connection with the request unread; trying another member",
			zap.String("host", req.Host), zap.String("tunnel", pc.tunnel().id))
		retries = t.cfg.Stats.RetriesResetUnread
	case h2Unprocessed(err) && (bodyless || rp != nil) && !clientFault(err):
		// The h2c member's backend refused the stream before processing it (REFUSED_STREAM,
		// a GOAWAY below it, a connection that closed before it was sent): no byte reached
		// its application, and the request can be sent again as it was.
		t.cfg.Logger.Debug("backend refused the request unprocessed; trying another member",
			zap.String("host", req.Host), zap.String("tunnel", pc.tunnel().id), zap.Error(err))
		retries = t.cfg.Stats.RetriesResetUnread
	case rp != nil && !p.retried && pc.failedBeforeResponse(err):
		// The member failed before any byte of a response came back, and the request may
		// be sent twice: send it, with the same body, to one other member.
		t.cfg.Logger.Debug("member failed before answering a replayable request; trying another member",
			zap.String("host", req.Host), zap.String("tunnel", pc.tunnel().id), zap.Error(err))
		retries = t.cfg.Stats.RetriesIdempotent
	default:
		return nil, err
	}
	pc2, m2, err2 := t.conn(p, req)
	if err2 != nil {
		return nil, err
	}
	retries.Add(1)
	rp.rewind(req)
	return t.attempt(pc2, m2, req, ri)
}

// replayOf reads ahead and returns what it takes to send req, to g, again to another member,
// or nil when the edge holds none: g does not retry idempotent requests
// (Config.RetryIdempotent), req is not one, or its body is too long to hold (bufferBody).
func (t *memberTransport) replayOf(req *http.Request, g *group.Group) (*replay, error) {
	// A body of unknown length whose client waits for 100 Continue is not read ahead for a
	// replay: it may be long, and the member's backend may refuse it before it asks for it.
	// (One announced over maxReplayBody is not read ahead anyway; a shorter one is.)
	heldBack := req.ContentLength < 0 && expectsContinue(req.Header)
	if t.cfg.RetryIdempotent == nil || !replayableMethod(req) || heldBack || !t.cfg.RetryIdempotent(g) {
		return nil, nil
	}
	rp, err := bufferBody(req)
	if err != nil {
		return nil, err
	}
	if rp != nil && rp.hasBody && req.Header.Get("Expect") != "" {
		// The edge holds the whole body (its client was told to send it): the member has
		// nothing to decide, and waiting for its 100 Continue would only delay it.
		req.Header.Del("Expect")
	}
	return rp, nil
}

// resendBody returns the body of req's next attempt after its stream on pc was refused:
// none for a request without one, the held replay (rp), or what pc's exchange kept of the
// public body followed by its rest. ok is false when the body cannot be sent again.
func resendBody(pc exchange, req *http.Request, rp *replay) (body io.ReadCloser, ok bool) {
	switch mc, _ := pc.(*memberConn); {
	case req.Body == nil || req.Body == http.NoBody:
		return req.Body, true
	case rp != nil && rp.hasBody:
		return &heldBody{Reader: bytes.NewReader(rp.body)}, true
	case mc != nil && mc.hold.Load() != nil:
		return mc.hold.Load().resend(), true
	}
	return nil, false
}

// exchange is one attempt of a request on one member: an HTTP/1.1 stream (memberConn) or
// a slot on an HTTP/2 connection (h2Exchange).
type exchange interface {
	// roundTrip sends req and returns the response, whose body releases m's stream slot
	// when done; on error, m is released.
	roundTrip(req *http.Request, m *group.Member) (*http.Response, error)
	// failedBeforeResponse reports whether err, from roundTrip, is the member's failure
	// before any byte of a response arrived.
	failedBeforeResponse(err error) bool
	tunnel() *Tunnel
}

// attempt sends req to member m on pc and reports how it went to Config.Outcome. With
// cookie affinity (ri.aff), the response hands out m's token if the request did not carry
// it; the response's stall watch learns what the response may hold at the edge.
func (t *memberTransport) attempt(pc exchange, m *group.Member, req *http.Request, ri *reqInfo) (*http.Response, error) {
	resp, err := pc.roundTrip(req, m)
	if err == nil {
		if aff := ri.aff; aff != nil && aff.cookie {
			setAffinityCookie(resp, m, aff)
		}
		if ri.watch != nil {
			ri.watch.expectResponse(windowOf(pc), resp)
		}
	}
	if f := t.cfg.Outcome; f != nil {
		switch {
		case err == nil && resp.StatusCode == http.StatusBadGateway:
			f(m, true, "backend answered 502")
		case err == nil:
			f(m, false, "")
		case req.Context().Err() != nil || clientFault(err):
			// The client ended the exchange: nothing is known of the member.
		case errors.As(err, new(*openError)):
			// The connector refused the new stream the request went out on.
			f(m, true, openRefused(err))
		case h2Refused(err):
			// The h2c member's backend refused the stream unprocessed: it is at its
			// stream limit, not failing.
		case pc.failedBeforeResponse(err):
			f(m, true, "reset before a response")
		default:
			f(m, true, "bad response: "+err.Error())
		}
	}
	return resp, err
}

// conn returns a stream to a member picked by p ready for req: a pooled idle stream to the
// picked member, or a fresh one; for an h2c member, a slot on one of its HTTP/2
// connections (an upgrade, as WebSocket, still goes over HTTP/1.1). A failed open is
// retried once on another member.
func (t *memberTransport) conn(p *picker, req *http.Request) (exchange, *group.Member, error) {
	return pick(p, func(tun *Tunnel) (exchange, error) {
		if tun.h2 != nil && req.Header.Get("Upgrade") == "" {
			c, err := tun.h2.get(req.Context(), t.cfg.OpenTimeout)
			if err != nil {
				return nil, err
			}
			return &h2Exchange{t: tun, c: c, openTimeout: t.cfg.OpenTimeout}, nil
		}
		if pc := tun.pool.get(t.cfg.IdleStreamTimeout); pc != nil {
			return pc, nil
		}
		// A new stream: the request follows its envelope at once, and its acknowledgement
		// is read ahead of the response (memberConn.readAck).
		pc, err := tun.openPipelined(req.Context(), t.cfg.OpenTimeout)
		if err != nil {
			return nil, err
		}
		return pc, nil
	})
}

// clientAddr is the IP of a remote address "host:port"; the zero Addr if it has none.
func clientAddr(remote string) netip.Addr {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr()
}
