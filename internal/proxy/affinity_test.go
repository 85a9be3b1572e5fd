package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// affinityPool registers members "m0" … "m<n-1>" of group "pool" with the given affinity,
// each served by serve (or, if nil, by a backend that answers with its tunnel id), and
// returns them by id.
func affinityPool(t *testing.T, reg *group.Registry, proto group.Proto, aff string, n int,
	serve func(i int) func(*connector, mux.Stream, wire.Envelope)) map[string]*group.Member {
	t.Helper()
	ms := map[string]*group.Member{}
	for i := range n {
		s := answerHTTP
		if serve != nil {
			s = serve(i)
		}
		c := startConnector(t, wire.AckOK, s)
		id := fmt.Sprint("m", i)
		tun := NewTunnel(context.Background(), id, proto, c.edge, &c.key)
		t.Cleanup(tun.Close)
		m, err := reg.Join(group.JoinRequest{ID: id, Proto: proto, Label: "pool", Group: "pool", Affinity: aff, Value: tun})
		require.NoError(t, err)
		require.NotEmpty(t, m.AffinityToken())
		ms[id] = m
	}
	return ms
}

// serveOne sends r to h and returns the answer.
func serveOne(h http.Handler, r *http.Request) *http.Response {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Result()
}

// servedBy returns the body of a 200 answer: the id of the member that served it.
func servedBy(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}

// affinityCookie returns the affinity cookie the response sets, or nil.
func affinityCookie(t *testing.T, resp *http.Response) *http.Cookie {
	t.Helper()
	var found *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == AffinityCookie {
			require.Nil(t, found, "one affinity cookie")
			found = c
		}
	}
	return found
}

// TestAffinityCookie: in a group with cookie affinity, the first answer hands out the
// serving member's token in a cookie; requests carrying it go to that member and get no new
// cookie; a forged value is ignored and replaced; over TLS the cookie is Secure.
func TestAffinityCookie(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	ms := affinityPool(t, reg, group.ProtoHTTP, group.AffinityCookie, 3, nil)
	h := NewHTTP(Config{Registry: reg, Domain: testDomain})
	get := func(cookie string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
		if cookie != "" {
			r.AddCookie(&http.Cookie{Name: AffinityCookie, Value: cookie})
		}
		return r
	}

	resp := serveOne(h, get(""))
	first := servedBy(t, resp)
	c := affinityCookie(t, resp)
	require.NotNil(t, c, "the first answer sets the cookie")
	require.Equal(t, ms[first].AffinityToken(), c.Value)
	require.Equal(t, "/", c.Path)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteLaxMode, c.SameSite)
	require.False(t, c.Secure, "plain HTTP")
	raw := resp.Header.Values("Set-Cookie")
	require.Equal(t, []string{AffinityCookie + "=" + c.Value + "; Path=/; HttpOnly; SameSite=Lax"}, raw)

	for range 10 {
		resp := serveOne(h, get(c.Value))
		require.Equal(t, first, servedBy(t, resp), "the cookie keeps the client on its member")
		require.Nil(t, affinityCookie(t, resp), "no new cookie while the member serves")
	}

	// Without the cookie, least-streams rotates: other members serve, each with its token.
	seen := map[string]bool{}
	for range 6 {
		resp := serveOne(h, get(""))
		id := servedBy(t, resp)
		seen[id] = true
		require.Equal(t, ms[id].AffinityToken(), affinityCookie(t, resp).Value)
	}
	require.Greater(t, len(seen), 1)

	for _, forged := range []string{"forged", strings.Repeat("A", len(c.Value)), c.Value + "x"} {
		resp := serveOne(h, get(forged))
		id := servedBy(t, resp)
		nc := affinityCookie(t, resp)
		require.NotNil(t, nc, "a forged cookie %q is replaced", forged)
		require.Equal(t, ms[id].AffinityToken(), nc.Value)
	}

	r := get("")
	r.TLS = &tls.ConnectionState{}
	resp = serveOne(h, r)
	servedBy(t, resp)
	require.True(t, affinityCookie(t, resp).Secure, "over TLS the cookie is Secure")
}

// TestAffinityCookieRetry: a request whose cookie names a member that fails before
// answering goes, with the idempotent retry, to another member, and the answer hands out
// that member's token.
func TestAffinityCookieRetry(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	var drop backend
	ms := affinityPool(t, reg, group.ProtoHTTP, group.AffinityCookie, 2, func(i int) func(*connector, mux.Stream, wire.Envelope) {
		if i == 0 {
			return drop.reply("")
		}
		return answerHTTP
	})
	stats := newStats()
	stats.RetriesIdempotent = new(atomic.Uint64)
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, RetryIdempotent: retryAll})
	r := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
	r.AddCookie(&http.Cookie{Name: AffinityCookie, Value: ms["m0"].AffinityToken()})
	resp := serveOne(h, r)
	require.Equal(t, "m1", servedBy(t, resp))
	require.Equal(t, int64(1), drop.hits.Load(), "the cookie's member was tried first")
	require.Equal(t, uint64(1), stats.RetriesIdempotent.Load())
	require.Equal(t, ms["m1"].AffinityToken(), affinityCookie(t, resp).Value)
}

// TestAffinityKeyed: with client_ip affinity a client's requests stay on one member, and
// clients spread over the members; with header affinity so do a header's values, and a
// request without the header is picked as usual. No cookie is handed out.
func TestAffinityKeyed(t *testing.T) {
	t.Run("client_ip", func(t *testing.T) {
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		affinityPool(t, reg, group.ProtoHTTP, group.AffinityClientIP, 3, nil)
		h := NewHTTP(Config{Registry: reg, Domain: testDomain})
		from := func(addr string) string {
			r := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
			r.RemoteAddr = addr
			resp := serveOne(h, r)
			require.Empty(t, resp.Header.Values("Set-Cookie"))
			return servedBy(t, resp)
		}
		spread := map[string]bool{}
		for i := range 30 {
			ip := fmt.Sprintf("203.0.113.%d", i)
			first := from(ip + ":1000")
			spread[first] = true
			for port := range 3 {
				require.Equal(t, first, from(fmt.Sprintf("%s:%d", ip, 2000+port)), "client %s stays on its member", ip)
			}
		}
		require.Greater(t, len(spread), 1, "clients spread over the members")
	})

	t.Run("header", func(t *testing.T) {
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		affinityPool(t, reg, group.ProtoHTTP, "header:X-User", 3, nil)
		h := NewHTTP(Config{Registry: reg, Domain: testDomain})
		as := func(user string) string {
			r := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
			if user != "" {
				r.Header.Set("x-user", user)
			}
			return servedBy(t, serveOne(h, r))
		}
		spread := map[string]bool{}
		for i := range 30 {
			user := fmt.Sprint("user-", i)
			first := as(user)
			spread[first] = true
			for range 3 {
				require.Equal(t, first, as(user), "user %s stays on its member", user)
			}
		}
		require.Greater(t, len(spread), 1, "users spread over the members")
		plain := map[string]bool{}
		for range 6 {
			plain[as("")] = true
		}
		require.Greater(t, len(plain), 1, "without the header, requests are spread as usual")
	})
}

// TestAffinityTCP: in a TCP group with client_ip affinity every connection from one address
// reaches the same member (without it, least-streams rotates them).
func TestAffinityTCP(t *testing.T) {
	for _, aff := range []string{group.AffinityClientIP, ""} {
		t.Run(fmt.Sprintf("affinity=%q", aff), func(t *testing.T) {
			var addr atomic.Value
			tcp := NewTCP(Config{OpenTimeout: 2 * time.Second, ListenTCP: func(int) (net.Listener, error) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err == nil {
					addr.Store(ln.Addr().String())
				}
				return ln, err
			}})
			defer tcp.Wait()
			defer tcp.Close()
			reg := group.NewRegistry(group.Config{LoadBalancing: true, Ports: group.PortRange{Lo: 40000, Hi: 40000},
				OnCreate: tcp.OnCreate, OnRemove: tcp.OnRemove})
			ms := affinityPool(t, reg, group.ProtoTCP, aff, 3, func(int) func(*connector, mux.Stream, wire.Envelope) {
				return func(_ *connector, st mux.Stream, env wire.Envelope) { _, _ = io.WriteString(st, env.TunnelID) }
			})
			seen := map[string]bool{}
			for range 6 {
				// Affinity is bounded by load: let the last connection leave its member.
				require.Eventually(t, func() bool {
					for _, m := range ms {
						if m.Active() != 0 {
							return false
						}
					}
					return true
				}, 5*time.Second, time.Millisecond)
				c, err := net.Dial("tcp", addr.Load().(string))
				require.NoError(t, err)
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				id, err := io.ReadAll(c)
				require.NoError(t, err)
				require.NoError(t, c.Close())
				seen[string(id)] = true
			}
			if aff == group.AffinityClientIP {
				require.Len(t, seen, 1, "one client address, one member: %v", seen)
			} else {
				require.Greater(t, len(seen), 1, "rotated: %v", seen)
			}
		})
	}
}
