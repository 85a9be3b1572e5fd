package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// hostileGroup is a group name that is markup: the page must show it as text.
const hostileGroup = `<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>`

// liveBound is how soon after the edge records a health transition the page must show it.
const liveBound = 2 * time.Second

// pageSetup is an edge with the demo's pool "web" on subdomain pool (backends A and B, tenant
// acme) and two pools of tenant globex: "globex-web" on subdomain other, and one named
// hostileGroup on subdomain evil, both forwarding to one backend.
type pageSetup struct {
	edge          *statusEdge
	a, b, globex  *pageBackend
	idA, idB      string // the pool's members, in join order
	poolKeyPrefix string
}

func newPageSetup(t *testing.T, region string) *pageSetup {
	t.Helper()
	s := &pageSetup{edge: newStatusEdge(t, region), poolKeyPrefix: "http/pool~"}
	s.a, s.b, s.globex = newPageBackend(t, "backend-a"), newPageBackend(t, "backend-b"), newPageBackend(t, "globex")
	poolConnector(t, "connector-a", s.edge, pageAcmeToken, "pool", "web", s.a.port())
	poolConnector(t, "connector-b", s.edge, pageAcmeToken, "pool", "web", s.b.port())
	poolConnector(t, "connector-globex", s.edge, pageGlobexToken, "other", "globex-web", s.globex.port())
	poolConnector(t, "connector-evil", s.edge, pageGlobexToken, "evil", hostileGroup, s.globex.port())
	require.Eventually(t, func() bool {
		for _, g := range pageAPIGet[[]pageAPIGroup](t, s.edge, "/api/groups") {
			if g.Label == "pool" && len(g.Members) == 2 && g.Members[0].Healthy && g.Members[1].Healthy {
				s.idA, s.idB = g.Members[0].ID, g.Members[1].ID
				return true
			}
		}
		return false
	}, waitTimeout, 50*time.Millisecond, "both members of the pool are healthy")
	return s
}

// TestBrowserStatusPage drives the status page in headless Chromium against a real edge
// process with its connectors and backends on loopback:
//
//   - without a token the page says one is needed and lists nothing;
//   - with the admin token it lists the demo-like pool with both members healthy (tenant,
//     edge region), each told apart from the other by its tunnel's name and its connector's
//     host shown beside its id, the other tenant's pools, a group whose name is markup as
//     plain text (nothing of it runs), and the route acme holds with no member (its
//     connector left) in the section of held routes;
//   - when backend B is stopped, B's row turns unhealthy without a reload, through the live
//     event stream, within liveBound of the transition the edge recorded;
//   - a tenant's token shows that tenant's groups and held routes only, for each of the two
//     tenants, and the token survives a reload (sessionStorage);
//   - after the edge is killed and restarted, the page reconnects by itself: its event
//     streams come back and show a new transition live;
//   - a wrong token gets a clear 401 message.
//
// The browser fails the test on any script exception or Content-Security-Policy violation.
func TestBrowserStatusPage(t *testing.T) {
	began := time.Now()
	ctx := startBrowser(t, 1200, 900)
	s := newPageSetup(t, "e2e-region")
	e := s.edge
	// A connector of acme's that goes away: its route stays acme's, with no member.
	gone := poolConnector(t, "connector-gone", e, pageAcmeToken, "gone", "gone-web", s.a.port())
	require.NoError(t, gone.cmd.Process.Kill())
	<-gone.done
	require.Eventually(t, func() bool {
		for _, r := range pageAPIGet[[]pageAPIRoute](t, e, "/api/routes") {
			if r.Kind == "http" && r.Label == "gone" {
				return !r.Live
			}
		}
		return false
	}, waitTimeout, 50*time.Millisecond, "the route of the connector that left is held with no member")
	t.Logf("edge, 5 connectors (one gone) and the browser up in %s", time.Since(began).Round(time.Millisecond))

	// Without a token.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.url("/"))))
	p, _ := waitPage(t, ctx, waitTimeout, "that a token is needed", func(p pageState) bool {
		// The script's words, not the ones of the page as served.
		return strings.Contains(p.Status, "needs a token") && strings.Contains(p.Status, "token above") && len(p.Groups) == 0
	})
	require.False(t, p.Held.Shown, "no held route without a token")
	require.Empty(t, p.Held.Routes)

	// The admin token: every group.
	enterToken(t, ctx, pageAdminToken)
	p, _ = waitPage(t, ctx, waitTimeout, "every group, the pool healthy and live, the held route", func(p pageState) bool {
		g, ok := p.group(s.poolKeyPrefix)
		return ok && len(p.Groups) == 3 && g.Live == "true" && len(g.Members) == 2 &&
			g.Members[0].Health == "healthy" && g.Members[1].Health == "healthy" && g.Members[1].Ticks >= 2 &&
			p.Held.Shown && len(p.Held.Routes) == 1
	})
	pool, _ := p.group(s.poolKeyPrefix)
	require.Equal(t, "web", pool.Name)
	require.Equal(t, []string{s.idA, s.idB}, []string{pool.Members[0].ID, pool.Members[1].ID}, "members in join order")
	for _, m := range pool.Members {
		require.Equal(t, "acme", m.Tenant)
		require.Equal(t, "e2e-region", m.Edge)
		require.Equal(t, "web", m.Name, "the tunnel's name in its connector's file")
		require.Equal(t, "tcp", m.Transport, "how its connector reaches the edge")
	}
	// The two members of one pool, both tunnels named web, told apart by their hosts.
	require.Equal(t, []string{"connector-a", "connector-b"}, []string{pool.Members[0].Host, pool.Members[1].Host})
	held := p.Held.Routes[0]
	require.Equal(t, "http/gone", held.Key)
	require.Equal(t, "acme", held.Tenant)
	require.Equal(t, "gone-web", held.Group)
	require.NotEqual(t, "—", held.Expires, "when the claim lapses")
	evil, ok := p.group("http/evil~")
	require.True(t, ok, "the hostile group is listed: %v", p.keys())
	require.Equal(t, hostileGroup, evil.Name, "its name is shown as text")
	require.False(t, p.Pwned, "nothing of the hostile name ran or became an element")
	require.Equal(t, pageAdminToken, p.Token, "the token is kept in sessionStorage")

	// Backend B stops: its row turns unhealthy live, with no reload.
	_, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.noReload = 42`))
	require.NoError(t, err)
	stopped := time.Now()
	s.b.stop()
	p, seen := waitPage(t, ctx, waitTimeout, "member B unhealthy", func(p pageState) bool {
		g, _ := p.group(s.poolKeyPrefix)
		b, _ := g.member(s.idB)
		return b.Health == "unhealthy"
	})
	at, healthy := lastTransition(t, e, s.idB)
	require.False(t, healthy)
	t.Logf("B unhealthy on the page %s after its backend stopped, %s after the edge recorded it",
		seen.Sub(stopped).Round(time.Millisecond), seen.Sub(at).Round(time.Millisecond))
	require.Less(t, seen.Sub(at), liveBound, "the page shows a transition within %s", liveBound)
	pool, _ = p.group(s.poolKeyPrefix)
	a, _ := pool.member(s.idA)
	require.Equal(t, "healthy", a.Health)
	require.NotEqual(t, "0", pool.Events, "the change came through the event stream")
	noReload, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.noReload || 0`))
	require.NoError(t, err)
	require.Equal(t, 42, noReload, "the page was not reloaded")
	waitPage(t, ctx, waitTimeout, "B's timeline ending unhealthy", func(p pageState) bool {
		g, _ := p.group(s.poolKeyPrefix)
		b, _ := g.member(s.idB)
		return b.Ticks >= 3
	})

	// Tenant tokens: each tenant sees only its own groups.
	enterToken(t, ctx, pageAcmeToken)
	p, _ = waitPage(t, ctx, waitTimeout, "acme's groups and held route only", func(p pageState) bool {
		return len(p.Groups) == 1 && strings.HasPrefix(p.Groups[0].Key, s.poolKeyPrefix) && p.Token == pageAcmeToken &&
			p.Held.Shown && len(p.Held.Routes) == 1
	})
	require.Contains(t, p.Status, "this token may see")
	require.Equal(t, "http/gone", p.Held.Routes[0].Key, "acme's own held route")
	enterToken(t, ctx, pageGlobexToken)
	globexView := func(p pageState) bool {
		keys := p.keys()
		slices.Sort(keys)
		return len(keys) == 2 && strings.HasPrefix(keys[0], "http/evil~") && strings.HasPrefix(keys[1], "http/other~")
	}
	p, _ = waitPage(t, ctx, waitTimeout, "globex's groups only, and none of acme's held routes", func(p pageState) bool {
		return globexView(p) && p.Held.Shown && len(p.Held.Routes) == 0
	})
	require.Contains(t, p.Held.Text, "No route is held without a member.")
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	p, _ = waitPage(t, ctx, waitTimeout, "globex's groups after a reload", func(p pageState) bool {
		other, _ := p.group("http/other~")
		return globexView(p) && other.Live == "true"
	})
	require.Equal(t, pageGlobexToken, p.Token)
	other, _ := p.group("http/other~")
	oldID := other.Members[0].ID

	// The edge dies and comes back: the page reconnects its streams by itself.
	e.kill9()
	waitPage(t, ctx, waitTimeout, "the streams down", func(p pageState) bool {
		other, _ := p.group("http/other~")
		return other.Live != "true"
	})
	e.start()
	restarted := time.Now()
	p, _ = waitPage(t, ctx, 45*time.Second, "the streams back with the re-registered members", func(p pageState) bool {
		other, ok := p.group("http/other~")
		evil, _ := p.group("http/evil~")
		return ok && globexView(p) && other.Live == "true" && evil.Live == "true" && len(other.Members) == 1 &&
			other.Members[0].ID != oldID && other.Members[0].Health == "healthy" && !strings.Contains(p.Status, "Cannot")
	})
	t.Logf("page live again %s after the edge restarted", time.Since(restarted).Round(time.Millisecond))
	other, _ = p.group("http/other~")
	s.globex.stop()
	_, seen = waitPage(t, ctx, waitTimeout, "globex's member unhealthy after the restart", func(p pageState) bool {
		other, _ := p.group("http/other~")
		return len(other.Members) == 1 && other.Members[0].Health == "unhealthy"
	})
	at, healthy = lastTransition(t, e, other.Members[0].ID)
	require.False(t, healthy)
	require.Less(t, seen.Sub(at), liveBound, "after the reconnection too")

	// A wrong token (last: a failure slows this address's next token checks).
	enterToken(t, ctx, "not-a-token-0123456789")
	waitPage(t, ctx, waitTimeout, "the refused token's message", func(p pageState) bool {
		return strings.Contains(p.Status, "token was refused (401") && len(p.Groups) == 0 && !p.Held.Shown
	})
	t.Logf("browser test took %s", time.Since(began).Round(time.Millisecond))
}

// TestBrowserStatusScreenshot writes a screenshot of the status page to the PNG file named by
// WARREN_SCREENSHOT (docs/status-page.png is made with it): acme's pool of two members, one
// healthy and one unhealthy after flapping, with their timelines and a dispatch rate. It is
// skipped when WARREN_SCREENSHOT is unset. WARREN_SCREENSHOT_WIDTH sets the window's width in
// CSS pixels (default 1000; 390 shows the phone layout).
//
//	WARREN_SCREENSHOT=$PWD/docs/status-page.png go -C examples/e2e test -run BrowserStatusScreenshot .
func TestBrowserStatusScreenshot(t *testing.T) {
	out := os.Getenv("WARREN_SCREENSHOT")
	if out == "" {
		t.Skip("set WARREN_SCREENSHOT to the PNG file to write")
	}
	width := 1000
	if w := os.Getenv("WARREN_SCREENSHOT_WIDTH"); w != "" {
		var err error
		width, err = strconv.Atoi(w)
		require.NoError(t, err, "WARREN_SCREENSHOT_WIDTH")
	}
	ctx := startBrowser(t, width, 700)
	s := newPageSetup(t, "eu-west-1")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.edge.url("/"))))
	enterToken(t, ctx, pageAcmeToken)
	waitPage(t, ctx, waitTimeout, "the pool, live", func(p pageState) bool {
		g, ok := p.group(s.poolKeyPrefix)
		return ok && g.Live == "true"
	})

	// Traffic for the rate, and backend B flapping for the timeline.
	client := publicClientAt(t, s.edge.http)
	stop := make(chan struct{})
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		for {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
			}
			if resp, err := client.Get("http://pool.localhost/"); err == nil {
				resp.Body.Close()
			}
		}
	}()
	defer func() { close(stop); <-traffic }()
	for i := range 3 {
		s.b.stop()
		waitHealth(t, ctx, s, "unhealthy")
		if i < 2 {
			s.b.start(t)
			waitHealth(t, ctx, s, "healthy")
		}
	}
	waitPage(t, ctx, waitTimeout, "a dispatch rate", func(p pageState) bool {
		g, _ := p.group(s.poolKeyPrefix)
		return strings.HasSuffix(g.Rate, "req/s") && g.Rate != "0.0 req/s"
	})
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("wrote %s (%d bytes)", out, len(png))
}

// waitHealth waits until the page shows member B with the health given.
func waitHealth(t *testing.T, ctx context.Context, s *pageSetup, health string) {
	t.Helper()
	waitPage(t, ctx, waitTimeout, "member B "+health, func(p pageState) bool {
		g, _ := p.group(s.poolKeyPrefix)
		b, _ := g.member(s.idB)
		return b.Health == health
	})
}
