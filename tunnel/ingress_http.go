package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// httpIngress is the public HTTP side: Host → group → member, per request.
type httpIngress struct {
	srv   *Server
	proxy *httputil.ReverseProxy
}

type groupCtxKey struct{}

func newHTTPIngress(s *Server) *httpIngress {
	h := &httpIngress{srv: s}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Host
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			// The edge already answered "100 Continue" to the client when the body was
			// first read; the backend gets a plain request.
			pr.Out.Header.Del("Expect")
		},
		Transport:    &memberTransport{srv: s},
		BufferPool:   bufferPool{},
		ErrorHandler: h.proxyError,
		ErrorLog:     zap.NewStdLog(s.log.Named("proxy")),
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *httpIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.srv.requests.http.Add(1)
	sub, ok := subdomainOf(r.Host, h.srv.cfg.Domain)
	if !ok {
		http.Error(w, fmt.Sprintf("no tunnel for host %q", r.Host), http.StatusNotFound)
		return
	}
	g := h.srv.registry.LookupHTTP(sub)
	if g == nil {
		http.Error(w, fmt.Sprintf("no tunnel for host %q", r.Host), http.StatusNotFound)
		return
	}
	if g.Proto == group.ProtoHTTPS && r.TLS == nil && h.srv.httpsPort.Load() != 0 {
		u := *r.URL
		u.Scheme, u.Host = "https", strings.TrimPrefix(h.srv.publicURL(group.ProtoHTTPS, sub), "https://")
		http.Redirect(w, r, u.String(), http.StatusPermanentRedirect)
		return
	}
	if max := h.srv.cfg.RequestBodyMaxBytes; max > 0 && r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength > max {
			http.Error(w, fmt.Sprintf("request body over the limit of %d bytes", max), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	ctx := context.WithValue(r.Context(), groupCtxKey{}, g)
	if r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		ctx = context.WithValue(ctx, abortBodyKey{}, func() { _ = rc.SetReadDeadline(pastTime) })
	}
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
}

type abortBodyKey struct{}

// bodyAborter returns a func that ends a blocked read of req's public body (or does nothing).
func bodyAborter(req *http.Request) func() {
	if f, ok := req.Context().Value(abortBodyKey{}).(func()); ok {
		return f
	}
	return func() {}
}

func (h *httpIngress) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errNoMember):
		if g, _ := r.Context().Value(groupCtxKey{}).(*group.Group); g != nil && g.Saturated() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("every backend for %s is at its concurrency limit", r.Host), http.StatusServiceUnavailable)
			return
		}
		http.Error(w, fmt.Sprintf("no healthy backend for %s", r.Host), http.StatusServiceUnavailable)
	case errors.As(err, &mbe):
		http.Error(w, fmt.Sprintf("request body over the limit of %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
	case r.Context().Err() != nil:
		// The client went away; nobody reads this answer.
		w.WriteHeader(http.StatusBadGateway)
	default:
		h.srv.log.Debug("proxy error", zap.String("host", r.Host), zap.Error(err))
		http.Error(w, "bad gateway: the tunnel's backend failed", http.StatusBadGateway)
	}
}

// subdomainOf returns the single label in front of domain in host, lower-cased; host may carry
// a port and a trailing dot.
func subdomainOf(host, domain string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	if len(host) <= len(domain)+1 || host[len(host)-len(domain)-1] != '.' ||
		!strings.EqualFold(host[len(host)-len(domain):], domain) {
		return "", false
	}
	sub := strings.ToLower(host[:len(host)-len(domain)-1])
	if sub == "" || strings.IndexByte(sub, '.') >= 0 {
		return "", false
	}
	return sub, true
}

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{}

func (bufferPool) Get() []byte { return *copyBufs.Get().(*[]byte) }

func (bufferPool) Put(b []byte) {
	if cap(b) == copyBufSize {
		b = b[:copyBufSize]
		copyBufs.Put(&b)
	}
}

// memberTransport is the reverse proxy's RoundTripper: it dispatches each request to one
// member of the group in the request's context and carries it over a pooled stream.
type memberTransport struct{ srv *Server }

// RoundTrip implements http.RoundTripper.
func (t *memberTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	g, _ := req.Context().Value(groupCtxKey{}).(*group.Group)
	if g == nil {
		return nil, errNoMember
	}
	p := &picker{s: t.srv, g: g}
	pc, m, err := t.srv.httpConn(p)
	if err != nil {
		return nil, err
	}
	resp, err := pc.roundTrip(req, m)
	if errors.Is(err, errUnread) && t.srv.cfg.RetryUnreadRequests && (req.Body == nil || req.Body == http.NoBody) && req.Context().Err() == nil {
		// The member's backend reset its connection with the request unread (it died or
		// dropped its queue): no byte of it reached a handler, and having no body it can be
		// sent again, to one other member if the retry is unspent.
		t.srv.log.Debug("backend reset the connection with the request unread; trying another member",
			zap.String("host", req.Host), zap.String("tunnel", m.Value.(*edgeTunnel).id))
		if pc2, m2, err2 := t.srv.httpConn(p); err2 == nil {
			t.srv.retries.unread.Add(1)
			return pc2.roundTrip(req, m2)
		}
	}
	return resp, err
}

// httpConn returns a stream to a member picked by p ready for one request: a pooled idle
// stream to the picked member, or a fresh one. A failed open is retried once on another member.
func (s *Server) httpConn(p *picker) (*memberConn, *group.Member, error) {
	return pick(p, func(t *edgeTunnel) (*memberConn, error) {
		if pc := t.pool.get(s.cfg.IdleStreamTimeout); pc != nil {
			return pc, nil
		}
		st, err := t.open("", s.cfg.OpenTimeout)
		if err != nil {
			return nil, err
		}
		return newMemberConn(t, st), nil
	})
}

// connPool keeps a member's idle HTTP streams for reuse (keep-alive per member).
type connPool struct {
	mu     sync.Mutex
	idle   []*memberConn
	closed bool
}

// get returns the most recently used idle stream that is still open and has been idle for
// less than maxIdle, or nil.
func (p *connPool) get(maxIdle time.Duration) *memberConn {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if time.Since(pc.idleSince) < maxIdle && pc.alive() {
			return pc
		}
		pc.close()
	}
}

// put returns an idle stream to the pool, or closes it if the pool is full or closed.
func (p *connPool) put(pc *memberConn) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdlePerMember {
		p.mu.Unlock()
		pc.close()
		return
	}
	pc.idleSince = time.Now()
	p.idle = append(p.idle, pc)
	p.mu.Unlock()
}

// closeIdle closes the idle streams; the pool stays usable.
func (p *connPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, pc := range idle {
		pc.close()
	}
}

// close closes the idle streams and every stream put back later.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.closeIdle()
}

// sweep closes streams idle since before cutoff, and lets the others drop their receive
// buffers (they are idle: nothing is in them).
func (p *connPool) sweep(cutoff time.Time) {
	p.mu.Lock()
	var old []*memberConn
	keep := p.idle[:0]
	for _, pc := range p.idle {
		if pc.idleSince.Before(cutoff) {
			old = append(old, pc)
		} else {
			pc.st.Shrink()
			keep = append(keep, pc)
		}
	}
	for i := len(keep); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = keep
	p.mu.Unlock()
	for _, pc := range old {
		pc.close()
	}
}
