package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

const hostileName = `<script>window.pwned=1</script>`

// statusPlane is a Plane over a registry holding one HTTP pool "web" on subdomain pool with
// two members (m1 of tenant acme, named web-a on host-a; m2 of tenant hostile, on host-b),
// m2 turned unhealthy. The pool's display name is hostileName; the second tenant's name, m2's
// tunnel name (which an edge cleans before it joins: this is the page's own escaping) and the
// health reason are markup too.
func statusPlane(t *testing.T, cfg config) (*Plane, *group.Registry) {
	t.Helper()
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	var key group.KeyHash
	key[0] = 0xab
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: hostileName, KeyHash: key, Tenant: "acme",
		Name: "web-a", Host: "host-a"})
	require.NoError(t, err)
	m2, err := reg.Join(group.JoinRequest{ID: "m2", Proto: group.ProtoHTTP, Label: "pool", Group: hostileName, KeyHash: key,
		Tenant: `<img src=x onerror="window.pwned=2">`, HealthKind: "tcp", Name: `<svg onload="window.pwned=5">`, Host: "host-b"})
	require.NoError(t, err)
	reg.SetHealth(m2, false, `refused <b onmouseover="window.pwned=3">`)
	cfg.View = reg.View()
	cfg.URL = func(g group.Info) string { return "http://" + g.Label + ".example.test" }
	cfg.Metrics = prometheus.NewRegistry()
	cfg.RegionID = `eu"><script>window.pwned=4</script>`
	p, err := newPlane(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p, reg
}

func serve(p *Plane, method, path, token string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "http://127.0.0.1"+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	p.Handler().ServeHTTP(rec, req)
	return rec
}

// GET / is the status page with a strict CSP; its assets are served under /static/; every
// other route keeps working and an unknown path is still 404.
func TestStatusPageRoutes(t *testing.T) {
	p, _ := statusPlane(t, config{})

	rec := serve(p, http.MethodGet, "/", "")
	require.Equal(t, http.StatusOK, rec.Code)
	h := rec.Header()
	require.Equal(t, "text/html; charset=utf-8", h.Get("Content-Type"))
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
	require.Equal(t, "no-store", h.Get("Cache-Control"))
	csp := h.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		require.Contains(t, csp, d)
	}
	require.NotContains(t, csp, "unsafe-inline")
	require.NotContains(t, csp, "unsafe-eval")
	require.Contains(t, rec.Body.String(), `<script src="static/status.js" defer></script>`)
	require.Contains(t, rec.Body.String(), `name="viewport"`)

	head := serve(p, http.MethodHead, "/", "")
	require.Equal(t, http.StatusOK, head.Code)
	require.Empty(t, head.Body.String())

	for name, ctype := range map[string]string{"/static/status.js": "text/javascript; charset=utf-8", "/static/status.css": "text/css; charset=utf-8"} {
		rec := serve(p, http.MethodGet, name, "")
		require.Equal(t, http.StatusOK, rec.Code, name)
		require.Equal(t, ctype, rec.Header().Get("Content-Type"), name)
		require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"), name)
		require.NotEmpty(t, rec.Header().Get("Content-Security-Policy"), name)
		require.NotEmpty(t, rec.Body.String(), name)
		// Revalidation by ETag.
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+name, nil)
		req.Header.Set("If-None-Match", rec.Header().Get("ETag"))
		again := httptest.NewRecorder()
		p.Handler().ServeHTTP(again, req)
		require.Equal(t, http.StatusNotModified, again.Code, name)
	}

	for _, path := range []string{"/nope", "/index.html", "/static/", "/static/status.html", "/static/status.go", "/healthz/", "/metrics/x"} {
		require.Equal(t, http.StatusNotFound, serve(p, http.MethodGet, path, "").Code, path)
	}
	require.Equal(t, http.StatusMethodNotAllowed, serve(p, http.MethodPost, "/", "").Code)
	require.Equal(t, http.StatusOK, serve(p, http.MethodGet, "/healthz", "").Code)
	require.Equal(t, http.StatusOK, serve(p, http.MethodGet, "/metrics", "").Code)
	api := serve(p, http.MethodGet, "/api/groups", "")
	require.Equal(t, http.StatusOK, api.Code)
	require.Equal(t, "application/json", api.Header().Get("Content-Type"))
}

// With the API open, the page renders the groups itself (the no-JavaScript view), and every
// value is escaped: no markup from a group name, tenant, reason or region survives.
func TestStatusPageEscapesEverything(t *testing.T) {
	p, _ := statusPlane(t, config{})
	body := serve(p, http.MethodGet, "/", "").Body.String()

	for _, raw := range []string{hostileName, `<img src=x`, `<b onmouseover`, `"><script>`, `<svg`} {
		require.NotContains(t, body, raw)
	}
	require.Contains(t, body, "&lt;script&gt;window.pwned=1&lt;/script&gt;", "the group's name, shown as text")
	require.Contains(t, body, `data-member="m1" data-health="healthy"`)
	require.Contains(t, body, `data-member="m2" data-health="unhealthy"`)
	require.Contains(t, body, `<span class="member-name">web-a</span> on <span class="member-host">host-a</span>`,
		"a member's name and host beside its id")
	require.Contains(t, body, `<span class="member-name">&lt;svg onload=&#34;window.pwned=5&#34;&gt;</span> on <span class="member-host">host-b</span>`)
	require.Contains(t, body, `data-group="http/pool~ab000000"`)
	require.Contains(t, body, "1/2 healthy")
	require.Contains(t, body, "0 dispatched")
	require.Contains(t, body, `class="tick bad"`, "m2's timeline shows its transition")

	// Exactly one <script> element: the page's own, from /static/.
	require.Len(t, regexp.MustCompile(`<script`).FindAllString(body, -1), 1)
}

// When the API needs a token, a plain page load (no token: a browser sends none) shows no
// group, only the note that a token is needed; the page's script asks for it.
func TestStatusPageNeedsATokenWhenTheAPIDoes(t *testing.T) {
	for name, cfg := range map[string]config{
		"admin token": {AdminToken: "admin"},
		"tenants only": {Authenticate: func(context.Context, string) (string, error) {
			return "acme", nil
		}},
	} {
		t.Run(name, func(t *testing.T) {
			p, _ := statusPlane(t, cfg)
			rec := serve(p, http.MethodGet, "/", "")
			require.Equal(t, http.StatusOK, rec.Code)
			body := rec.Body.String()
			require.Contains(t, body, "This edge needs a token to show its groups")
			require.NotContains(t, body, "data-member")
			require.NotContains(t, body, "pwned=1", "the group's name")
			require.NotContains(t, body, "acme")
			require.Equal(t, http.StatusUnauthorized, serve(p, http.MethodGet, "/api/groups", "").Code)
		})
	}
}

// The weight and priority columns appear when a member has the field and not otherwise.
func TestStatusPageWeightColumns(t *testing.T) {
	render := func(members ...statusMember) string {
		var buf bytes.Buffer
		g := statusGroup{Protocol: "http", Label: "pool", Name: "web", KeyHashShort: "ab000000", Members: members}
		for _, m := range members {
			g.ShowWeight = g.ShowWeight || m.Weight != nil
			g.ShowPriority = g.ShowPriority || m.Priority != nil
		}
		require.NoError(t, statusTemplate.Execute(&buf, statusPage{Open: true, Groups: []statusGroup{g}, Rendered: time.Now()}))
		return buf.String()
	}
	body := render(statusMember{ID: "a", Healthy: true}, statusMember{ID: "b"})
	require.NotContains(t, body, "Weight")
	require.NotContains(t, body, "Priority")
	body = render(statusMember{ID: "a", Healthy: true, Weight: 3.0, Priority: 0.0}, statusMember{ID: "b", Weight: 1.0, Priority: 1.0})
	require.Contains(t, body, "<th>Weight</th>")
	require.Contains(t, body, "<th>Priority</th>")
	require.Contains(t, body, `<td data-label="Weight" class="num">3</td>`)
	require.Contains(t, body, `<td data-label="Priority" class="num">1</td>`)
}

// GET /api/groups carries the pool's dispatch counter (the page's rate) for a caller that
// sees every member of the pool, and not for a tenant that sees only some of them.
func TestGroupsListDispatches(t *testing.T) {
	p, _ := statusPlane(t, config{AdminToken: "admin", Authenticate: func(_ context.Context, token string) (string, error) {
		if token == "acme-token" {
			return "acme", nil
		}
		return "", ErrInvalidToken
	}})
	groups := func(token string) []map[string]any {
		rec := serve(p, http.MethodGet, "/api/groups", token)
		require.Equal(t, http.StatusOK, rec.Code)
		var out []map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		return out
	}
	admin := groups("admin")
	require.Len(t, admin, 1)
	require.Equal(t, 0.0, admin[0]["dispatches"])
	acme := groups("acme-token")
	require.Len(t, acme, 1)
	require.NotContains(t, acme[0], "dispatches", "acme sees one member of two")
}

// The page's files keep to the CSP and load nothing from another host: no inline script,
// style or event handler, no absolute URL in src, href, url() or @import.
func TestStatusPageAssetsAreSelfContained(t *testing.T) {
	inline := regexp.MustCompile(`(?i)\son[a-z]+\s*=|\sstyle\s*=|<script>|<style|javascript:`)
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//|url\(|@import`)
	require.NoError(t, fs.WalkDir(staticFiles, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(staticFiles, path)
		require.NoError(t, err)
		s := string(b)
		if strings.HasSuffix(path, ".html") {
			require.Empty(t, inline.FindAllString(s, -1), path)
		}
		require.Empty(t, external.FindAllString(s, -1), path)
		require.NotContains(t, s, "innerHTML", path)
		require.NotContains(t, s, "EventSource(", path)
		return nil
	}))
}
