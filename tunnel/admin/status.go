package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The status page is plain HTML, CSS and JavaScript embedded in the binary: no build step,
// nothing loaded from another host.
//
//go:embed static
var staticFiles embed.FS

// statusTemplate renders GET / (html/template escapes every value it prints).
var statusTemplate = template.Must(template.New("status.html").Funcs(template.FuncMap{
	"clock": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	// clockp is clock of an optional time: "—" for none.
	"clockp": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
}).ParseFS(staticFiles, "static/status.html"))

// statusCSP is the Content-Security-Policy of the status page and its assets: scripts,
// styles and API calls from the admin listener itself only, no inline script or style, no
// frames, no forms posted anywhere.
const statusCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// statusAssets are the files under /static/ with their content types, read once.
var statusAssets = func() map[string]staticAsset {
	out := map[string]staticAsset{}
	for name, ctype := range map[string]string{
		"status.js":  "text/javascript; charset=utf-8",
		"status.css": "text/css; charset=utf-8",
	} {
		b, err := fs.ReadFile(staticFiles, "static/"+name)
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		sum := sha256.Sum256(b)
		out[name] = staticAsset{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return out
}()

type staticAsset struct {
	body        []byte
	ctype, etag string
}

// securityHeaders sets the headers every response of the status page carries.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
}

// serveStatic serves GET /static/{name}: the page's script and style sheet. Any other name
// is 404.
func serveStatic(w http.ResponseWriter, r *http.Request) {
	a, ok := statusAssets[strings.TrimPrefix(r.URL.Path, "/static/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", a.ctype)
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}

// statusPage is the data of the page's template.
type statusPage struct {
	// Region is the edge's region id ("" when unset).
	Region string
	// Open is set when the API needs no token: the page then lists the groups itself.
	Open bool
	// Groups are the groups an unauthenticated caller sees (only when Open).
	Groups []statusGroup
	// More is set when the groups did not fit on one page of the API.
	More bool
	// Held are the routes held with no member (only when Open); HeldErr is set when they
	// could not be read.
	Held    []RouteInfo
	HeldErr bool
	// Rendered is when the page was rendered.
	Rendered time.Time
}

// statusGroup and statusMember are read back from the JSON of GET /api/groups, so the page
// shows exactly what the API does: fields added there (such as a member's weight and
// priority) appear here as soon as they are present.
type statusGroup struct {
	Protocol     string         `json:"protocol"`
	Label        string         `json:"label"`
	Name         string         `json:"name"`
	KeyHashShort string         `json:"key_hash_short"`
	URL          string         `json:"url"`
	MemberCount  int            `json:"member_count"`
	HealthyCount int            `json:"healthy_count"`
	Reserved     bool           `json:"reserved"`
	Dispatches   *uint64        `json:"dispatches"`
	Members      []statusMember `json:"members"`
	// ShowWeight and ShowPriority are set when a member has the field.
	ShowWeight, ShowPriority bool `json:"-"`
}

type statusMember struct {
	ID            string `json:"id"`
	Tenant        string `json:"tenant"`
	Name          string `json:"name"`
	Host          string `json:"host"`
	Transport     string `json:"transport"`
	Healthy       bool   `json:"healthy"`
	Draining      bool   `json:"draining"`
	ActiveStreams int64  `json:"active_streams"`
	HealthKind    string `json:"health_kind"`
	Weight        any    `json:"weight"`
	Priority      any    `json:"priority"`
	Ejected       bool   `json:"ejected"`
	Ramping       bool   `json:"ramping"`
	// History is the member's last health transitions, oldest first.
	History []HealthEvent `json:"-"`
}

// Key names the group's event stream: /api/groups/{Protocol}/{Key}/events.
func (g statusGroup) Key() string { return g.Label + "~" + g.KeyHashShort }

// Last is the member's latest health transition, if any.
func (m statusMember) Last() *HealthEvent {
	if len(m.History) == 0 {
		return nil
	}
	return &m.History[len(m.History)-1]
}

// serveStatusPage serves GET /: the live status page. Its script reads the API with the
// token the visitor enters. Without JavaScript it is a snapshot: the groups are rendered into
// the HTML only when the API is open (no admin token and no tenant authenticator), since an
// unauthenticated request is all a plain page load can make; otherwise it says a token is
// needed.
func (p *Plane) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	data := statusPage{Region: p.cfg.RegionID, Open: p.apiOpen(), Rendered: time.Now()}
	if data.Open && !p.hostAllowed(r.Host) {
		refuseHost(w, r.Host)
		return
	}
	if data.Open {
		data.Groups, data.More = p.statusGroups(r.Context())
		data.Held, data.HeldErr = p.statusHeld(r.Context())
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, data); err != nil {
		p.log.Warn("status page: rendering failed: " + err.Error())
		http.Error(w, "rendering the status page failed", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// apiOpen reports whether the API answers without a token.
func (p *Plane) apiOpen() bool { return !p.hasAdmin && p.cfg.Authenticate == nil }

// statusGroups returns the first page of GET /api/groups as the admin sees it, with each
// member's health history, and whether more pages follow.
func (p *Plane) statusGroups(ctx context.Context) ([]statusGroup, bool) {
	req, err := http.NewRequestWithContext(context.WithValue(ctx, scopeKey{}, scope{admin: true}),
		http.MethodGet, "/api/groups?limit="+strconv.Itoa(MaxPageSize), nil)
	if err != nil {
		return nil, false
	}
	rec := &bufferWriter{header: http.Header{}}
	p.apiGroups(rec, req)
	var groups []statusGroup
	if rec.status != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &groups) != nil {
		return nil, false
	}
	for i := range groups {
		g := &groups[i]
		for j := range g.Members {
			m := &g.Members[j]
			g.ShowWeight = g.ShowWeight || m.Weight != nil
			g.ShowPriority = g.ShowPriority || m.Priority != nil
			if hist, ok := p.cfg.View.History(m.ID); ok {
				m.History = make([]HealthEvent, len(hist))
				for k, t := range hist {
					m.History[k] = HealthEvent(t)
				}
			}
		}
	}
	return groups, rec.header.Get("X-Next-Cursor") != ""
}

// statusHeld returns the routes of the first page of GET /api/routes, as the admin sees it,
// that are held with no member (neither live nor a reserved endpoint's, which the groups
// list already shows), and whether they could not be read.
func (p *Plane) statusHeld(ctx context.Context) ([]RouteInfo, bool) {
	req, err := http.NewRequestWithContext(context.WithValue(ctx, scopeKey{}, scope{admin: true}),
		http.MethodGet, "/api/routes?limit="+strconv.Itoa(MaxPageSize), nil)
	if err != nil {
		return nil, true
	}
	rec := &bufferWriter{header: http.Header{}}
	p.apiRoutes(rec, req)
	var routes []RouteInfo
	if rec.status != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &routes) != nil {
		return nil, true
	}
	return heldRoutes(routes), false
}

// heldRoutes are the routes of list that are held with no member: not live, not reserved.
func heldRoutes(list []RouteInfo) []RouteInfo {
	var out []RouteInfo
	for _, r := range list {
		if !r.Live && !r.Reserved {
			out = append(out, r)
		}
	}
	return out
}

// bufferWriter is an http.ResponseWriter that keeps the answer in memory.
type bufferWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.header }

func (b *bufferWriter) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}
