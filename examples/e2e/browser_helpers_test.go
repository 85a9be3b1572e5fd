package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// Tokens of the status page's edge.
const (
	pageAdminToken  = "page-admin-token-0123456789"
	pageAcmeToken   = "acme-tenant-token-0123456789"
	pageGlobexToken = "globex-tenant-token-0123456789"
)

// browserBinary returns the Chromium (or Chrome) binary to drive. Without one the test is
// skipped, unless WARREN_REQUIRE_BROWSER is set (CI sets it): then it fails.
func browserBinary(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell", "/usr/bin/chromium"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const msg = "no Chromium binary found (on Debian: apt-get install -y chromium)"
	if os.Getenv("WARREN_REQUIRE_BROWSER") != "" {
		t.Fatal(msg + "; WARREN_REQUIRE_BROWSER is set, so this is a failure")
	}
	t.Skip(msg + "; set WARREN_REQUIRE_BROWSER=1 to fail instead of skipping")
	return ""
}

// startBrowser starts a headless Chromium for the test and returns a tab's context. The browser
// resolves no host name but loopback addresses and uses no proxy; it is closed, and its
// process waited for, when the test ends. Exceptions and Content-Security-Policy violations
// on the page fail the test.
func startBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserBinary(t)),
		chromedp.WindowSize(width, height),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("lang", "en-US"),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(cctx)
		ccancel()
		cancel()
		allocCancel() // waits for the browser process
	})
	start := time.Now()
	var mu sync.Mutex
	var problems []string
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *log.EventEntryAdded:
			if strings.Contains(ev.Entry.Text, "Content Security Policy") {
				msg = "CSP: " + ev.Entry.Text
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				for _, a := range ev.Args {
					if a.Description != "" && strings.Contains(a.Description, "Content Security Policy") {
						msg = "CSP: " + a.Description
					}
				}
			}
		}
		if msg != "" {
			mu.Lock()
			problems = append(problems, msg)
			mu.Unlock()
		}
	}), "starting the browser")
	t.Logf("browser started in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("the page reported %s", p)
		}
	})
	return ctx
}

// pageState is what the status page shows, read from its DOM.
type pageState struct {
	Status string      `json:"status"`
	Groups []pageGroup `json:"groups"`
	Pwned  bool        `json:"pwned"`
	Token  string      `json:"token"`
	// Held is the section of routes held with no member: shown or not, its note, its rows.
	Held pageHeld `json:"held"`
}

type pageHeld struct {
	Shown  bool            `json:"shown"`
	Text   string          `json:"text"`
	Routes []pageHeldRoute `json:"routes"`
}

type pageHeldRoute struct {
	Key     string `json:"key"` // kind/label
	Tenant  string `json:"tenant"`
	Group   string `json:"group"`
	Expires string `json:"expires"`
}

type pageGroup struct {
	Key     string       `json:"key"`
	Name    string       `json:"name"`
	Live    string       `json:"live"`
	Events  string       `json:"events"`
	Rate    string       `json:"rate"`
	Members []pageMember `json:"members"`
}

type pageMember struct {
	ID     string `json:"id"`
	Health string `json:"health"`
	Ticks  int    `json:"ticks"`
	Tenant string `json:"tenant"`
	Edge   string `json:"edge"`
	// Name, Host and Transport are the member's tunnel name, connector host and transport
	// as the page shows them beside its id ("" when not shown).
	Name      string `json:"name"`
	Host      string `json:"host"`
	Transport string `json:"transport"`
}

// readPage is the script that reads a pageState.
const readPage = `(() => ({
  status: document.getElementById('status').textContent,
  pwned: window.pwned !== undefined || document.querySelectorAll('img').length > 0 ||
    document.querySelectorAll('script').length !== 1,
  token: sessionStorage.getItem('warren.statusToken') || '',
  groups: [...document.querySelectorAll('section.group')].map((s) => ({
    key: s.dataset.group,
    name: s.querySelector('.name').textContent,
    live: s.dataset.live || '',
    events: s.dataset.events || '',
    rate: s.querySelector('.rate').textContent,
    members: [...s.querySelectorAll('tr[data-member]')].map((r) => ({
      id: r.dataset.member,
      health: r.dataset.health,
      ticks: r.querySelectorAll('.tick').length,
      tenant: r.querySelector('td[data-label=Tenant]').textContent,
      edge: r.querySelector('td[data-label=Edge]').textContent,
      name: r.querySelector('td[data-label=Member] .member-name')?.textContent || '',
      host: r.querySelector('td[data-label=Member] .member-host')?.textContent || '',
      transport: r.querySelector('td[data-label=Member] .member-transport')?.textContent || '',
    })),
  })),
  held: (() => {
    const h = document.getElementById('held-routes');
    return {
      shown: !h.hidden,
      text: h.textContent,
      routes: [...h.querySelectorAll('tr[data-route]')].map((r) => ({
        key: r.dataset.route,
        tenant: r.querySelector('td[data-label=Tenant]').textContent,
        group: r.querySelector('td[data-label=Group]').textContent,
        expires: r.querySelector('td[data-label=Expires]').textContent,
      })),
    };
  })(),
}))()`

func (s pageState) group(prefix string) (pageGroup, bool) {
	for _, g := range s.Groups {
		if strings.HasPrefix(g.Key, prefix) {
			return g, true
		}
	}
	return pageGroup{}, false
}

func (s pageState) keys() []string {
	var out []string
	for _, g := range s.Groups {
		out = append(out, g.Key)
	}
	return out
}

func (g pageGroup) member(id string) (pageMember, bool) {
	for _, m := range g.Members {
		if m.ID == id {
			return m, true
		}
	}
	return pageMember{}, false
}

// waitPage reads the page every 50 ms until ok holds, and returns when it first did. It
// fails the test after timeout, with what the page showed last.
func waitPage(t *testing.T, ctx context.Context, timeout time.Duration, what string, ok func(pageState) bool) (pageState, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last pageState
	var lastErr error
	for {
		st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
		now := time.Now()
		if err == nil {
			last = st
			if ok(st) {
				return st, now
			}
		}
		lastErr = err
		if now.After(deadline) {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("the page did not show %s within %s (last error: %v); it showed:\n%s", what, timeout, lastErr, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// enterToken types token into the page's token field and submits it.
func enterToken(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('token').value = ''`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS("#token-form")), // the script has run
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)),
	))
}

// statusEdge is an edge process with an admin listener, an admin token and two tenants,
// restartable on the same ports.
type statusEdge struct {
	t                           *testing.T
	path                        string
	control, http, admin, tcpLo int
	proc                        *proc
}

func newStatusEdge(t *testing.T, region string) *statusEdge {
	t.Helper()
	ports := freePorts(t, 4)
	e := &statusEdge{t: t, path: filepath.Join(t.TempDir(), "server.toml"),
		control: ports[0], http: ports[1], admin: ports[2], tcpLo: ports[3]}
	require.NoError(t, os.WriteFile(e.path, fmt.Appendf(nil, `
[server]
domain = "localhost"
bind = "127.0.0.1"
http_port = %d
control_port = %d
admin_port = %d
region_id = %q

[auth]
require_auth = true
admin_token = %q
[[auth.tenants]]
name = "acme"
token = %q
[[auth.tenants]]
name = "globex"
token = %q

[limits]
tcp_port_range = [%d, %d]
drain_timeout_secs = 1

[load_balancing]
enabled = true
`, e.http, e.control, e.admin, region, pageAdminToken, pageAcmeToken, pageGlobexToken, e.tcpLo, e.tcpLo), 0o600))
	e.start()
	return e
}

// start runs the edge and waits for its admin listener.
func (e *statusEdge) start() {
	t := e.t
	t.Helper()
	e.proc = start(t, "edge", "edge", "-config", e.path)
	waitAdmin(t, e.proc, e.url("/healthz"))
}

// kill9 kills the edge with SIGKILL.
func (e *statusEdge) kill9() {
	require.NoError(e.t, e.proc.cmd.Process.Kill())
	<-e.proc.done
}

func (e *statusEdge) url(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", e.admin, path)
}

// pageAPIGet GETs path on the admin API with the admin token and decodes the JSON answer.
func pageAPIGet[T any](t *testing.T, e *statusEdge, path string) T {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.url(path), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+pageAdminToken)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
	var v T
	require.NoError(t, json.Unmarshal(body, &v), "%s: %s", path, body)
	return v
}

// pageAPIGroup is the part of a GET /api/groups entry the tests read.
type pageAPIGroup struct {
	Protocol     string `json:"protocol"`
	Label        string `json:"label"`
	KeyHashShort string `json:"key_hash_short"`
	Members      []struct {
		ID      string `json:"id"`
		Healthy bool   `json:"healthy"`
	} `json:"members"`
}

// pageAPIRoute is the part of a GET /api/routes entry the tests read.
type pageAPIRoute struct {
	Kind  string `json:"kind"`
	Label string `json:"label"`
	Live  bool   `json:"live"`
}

// lastTransition returns when the edge recorded the member's latest health transition, and
// the bit it set.
func lastTransition(t *testing.T, e *statusEdge, id string) (time.Time, bool) {
	t.Helper()
	hist := pageAPIGet[[]struct {
		At      time.Time `json:"at"`
		Healthy bool      `json:"healthy"`
	}](t, e, "/api/tunnels/"+id+"/health-events")
	require.NotEmpty(t, hist)
	last := hist[len(hist)-1]
	return last.At, last.Healthy
}

// poolConnector starts a connector with one HTTP tunnel, named web, on subdomain in the
// named group, probed over TCP every 200 ms (unhealthy after two failures). The connector
// gives its name as its host name (hostname), which the edge shows beside its member.
func poolConnector(t *testing.T, name string, e *statusEdge, token, subdomain, groupName string, port int) *proc {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `server: 127.0.0.1:%d
auth_token: %q
hostname: %s
drain_timeout_secs: 1
tunnels:
  web:
    proto: http
    local_port: %d
    subdomain: %s
    group: %q
    group_key: %q
    health_check:
      type: tcp
      interval_secs: 0.2
      timeout_secs: 0.5
      max_failed: 2
`, e.control, token, name, port, subdomain, groupName, subdomain+"-key"), 0o600))
	// Each connector its own runtime directory, hence its own control socket.
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	p := start(t, name, "connector", "start", "--config", path)
	p.line(t, "tunnel web: ")
	return p
}

// pageBackend is an HTTP backend that can be stopped and started again on its address.
type pageBackend struct {
	name, addr string
	srv        *http.Server
	done       chan struct{}
}

func newPageBackend(t *testing.T, name string) *pageBackend {
	t.Helper()
	b := &pageBackend{name: name, addr: "127.0.0.1:0"}
	b.start(t)
	t.Cleanup(b.stop)
	return b
}

func (b *pageBackend) port() int {
	_, p, _ := net.SplitHostPort(b.addr)
	var n int
	fmt.Sscan(p, &n)
	return n
}

func (b *pageBackend) start(t *testing.T) {
	t.Helper()
	var ln net.Listener
	require.Eventually(t, func() bool {
		var err error
		ln, err = net.Listen("tcp", b.addr)
		return err == nil
	}, waitTimeout, 50*time.Millisecond, "backend %s listens on %s again", b.name, b.addr)
	b.addr, b.done = ln.Addr().String(), make(chan struct{})
	b.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, b.name)
	})}
	srv, done := b.srv, b.done
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // http.ErrServerClosed at stop
	}()
}

// stop closes the backend (its port refuses connections) and waits for it; idempotent.
func (b *pageBackend) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.done
		b.srv = nil
	}
}
