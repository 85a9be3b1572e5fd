package tunnel

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// poolMembers returns the members of the pool on subdomain label, in join order.
func poolMembers(t *testing.T, e *testEdge, label string) []group.MemberInfo {
	t.Helper()
	g, ok := e.Registry().LookupHTTP(label)
	require.True(t, ok, "pool %s", label)
	return g.Members
}

// The members of a pool are told apart by their tunnel's name and their connector's host:
// a connector sends both with each registration (the host by default the machine's name), the
// edge keeps them on the member. An older connector that sends neither still registers, and
// a hostile one cannot make the edge keep markup or more than the limit.
func TestMembersCarryTheirNameAndHost(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	b := backend(t, "b")
	spec := func(name string) TunnelSpec {
		return TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k", Name: name}
	}
	_, err := e.connect(WithHostname("host-a")).Forward(ctxT(t), spec("web-a"), hostPort(b.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), spec("web b <i>"), hostPort(b.URL))
	require.NoError(t, err)
	_, err = e.connect(WithHostname("")).Forward(ctxT(t), spec(""), hostPort(b.URL))
	require.NoError(t, err)

	ms := poolMembers(t, e, "pool")
	require.Len(t, ms, 3)
	require.Equal(t, [2]string{"web-a", "host-a"}, [2]string{ms[0].Name, ms[0].Host})
	osHost, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, "web_b__i_", ms[1].Name, "what is not a letter, digit, '.', '-' or '_' is '_'")
	require.Equal(t, wire.CleanDisplay(osHost, wire.MaxHostLen), ms[1].Host, "the machine's name by default")
	require.Equal(t, [2]string{"", ""}, [2]string{ms[2].Name, ms[2].Host}, "neither given: none shown")

	// An older connector: a Register without the fields.
	_, ctrl := rawControl(t, e.controlAddr)
	hello(t, ctrl)
	_, err = ctrl.Write(rawFrame(wire.TypeRegister, `{"req":1,"proto":"http","label":"old"}`))
	require.NoError(t, err)
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Registered{}, m, "%+v", m)
	old := poolMembers(t, e, "old")
	require.Len(t, old, 1)
	require.Empty(t, old[0].Name)
	require.Empty(t, old[0].Host)

	// A hostile one: markup, control characters and 60 KB, in one frame.
	hostile := `{"req":2,"proto":"http","label":"evil","name":"<script>alert(1)</script>\u0000\u202e` +
		strings.Repeat("n", 1000) + `","host":"` + strings.Repeat("<b>", 20000) + `"}`
	_, err = ctrl.Write(rawFrame(wire.TypeRegister, hostile))
	require.NoError(t, err)
	m, err = wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Registered{}, m, "display strings never refuse a registration: %+v", m)
	evil := poolMembers(t, e, "evil")
	require.Len(t, evil, 1)
	require.Len(t, evil[0].Name, wire.MaxNameLen)
	require.True(t, strings.HasPrefix(evil[0].Name, "_script_alert_1___script___n"), evil[0].Name)
	require.Equal(t, strings.Repeat("_b_", 100)[:wire.MaxHostLen], evil[0].Host, "cut to the limit")
}
