package admin

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// Each member of a pool is listed with its tunnel's name and its connector's host, in
// GET /api/groups and GET /api/tunnels(/{id}) and on the status page, so that the members of
// one pool can be told apart; a member of an older connector has both empty, and a name that
// is markup reaches neither the JSON nor the page as markup.
func TestMembersAreListedWithNameAndHost(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	c := newAPIClient(t, e.adminAddr)
	b := backend(t, "b")
	named := func(name string) tunnel.TunnelSpec { sp := pool("pool"); sp.Name = name; return sp }
	ta, err := e.connect(tunnel.WithHostname("host-a")).Forward(ctxT(t), named("web-a"), hostPort(b.URL))
	require.NoError(t, err)
	tb, err := e.connect(tunnel.WithHostname("host-b")).Forward(ctxT(t), named("<b>web-b</b>"), hostPort(b.URL))
	require.NoError(t, err)
	old, _ := rawMember(t, e, "", probedRegister("pool", "web", "shared-secret")) // no name, no host

	groups := getJSON[[]GroupInfo](c, "", "/api/groups")
	require.Len(t, groups, 1)
	type who struct{ ID, Name, Host string }
	var got []who
	for _, m := range groups[0].Members {
		got = append(got, who{m.ID, m.Name, m.Host})
	}
	require.Equal(t, []who{{ta.ID(), "web-a", "host-a"}, {tb.ID(), "_b_web-b__b_", "host-b"}, {old, "", ""}}, got)

	tunnels := tunnelsByID(getJSON[[]TunnelInfo](c, "", "/api/tunnels"))
	require.Equal(t, "web-a", tunnels[ta.ID()].Name)
	require.Equal(t, "host-a", tunnels[ta.ID()].Host)
	one := getJSON[TunnelInfo](c, "", "/api/tunnels/"+tb.ID())
	require.Equal(t, [2]string{"_b_web-b__b_", "host-b"}, [2]string{one.Name, one.Host})
	status, _, raw := c.get("", "/api/tunnels/"+old)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(raw), `"name":"","host":""`, "present and empty for an older connector")

	status, _, page := c.get("", "/")
	require.Equal(t, http.StatusOK, status)
	body := string(page)
	require.Contains(t, body, `<span class="member-name">web-a</span> on <span class="member-host">host-a</span> · over <span class="member-transport">tcp</span>`)
	require.Contains(t, body, `<span class="member-name">_b_web-b__b_</span> on <span class="member-host">host-b</span>`)
	require.NotContains(t, body, "<b>web-b")
}
