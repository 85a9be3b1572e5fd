package cluster

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// A member's tunnel name, connector host and transport travel with its record: every edge of the
// cluster lists the members of a pool with them, its own and the other edges' alike.
func TestRemoteMembersCarryTheirNameAndHost(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	named := func(name string) tunnel.TunnelSpec { sp := clusterPool("k"); sp.Name = name; return sp }
	ta, err := a.connect(tunnel.WithHostname("host-a")).Forward(ctxT(t), named("web-a"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	tb, err := b.connect(tunnel.WithHostname("host-b")).Forward(ctxT(t), named("web-b"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	both := map[string]int{"a": 1, "b": 1}
	a.waitMembers(t, "pool", both)
	b.waitMembers(t, "pool", both)

	want := map[string][4]string{ta.ID(): {"a", "web-a", "host-a", "tcp"}, tb.ID(): {"b", "web-b", "host-b", "tcp"}}
	for _, e := range []*clusterEdge{a, b} {
		groups := e.groups(t)
		require.Len(t, groups, 1)
		got := map[string][4]string{}
		for _, m := range groups[0].Members {
			got[m.ID] = [4]string{m.EdgeID, m.Name, m.Host, m.Transport}
		}
		require.Equal(t, want, got, "edge %s", e.id)
	}
}

// A record of an older edge has no name or host: it still decodes, with both empty.
func TestMemberRecordWithoutNameAndHost(t *testing.T) {
	var rec memberRecord
	require.NoError(t, json.Unmarshal([]byte(`{"edge":"old","tunnel":"t1","proto":"http","label":"pool","group":"web","key_hash":"`+
		"00000000000000000000000000000000000000000000000000000000000000ab"+`","health_kind":"none","healthy":true}`), &rec))
	require.Equal(t, "t1", rec.Tunnel)
	require.Empty(t, rec.Name)
	require.Empty(t, rec.Host)
	b, err := json.Marshal(memberRecord{Tunnel: "t1"})
	require.NoError(t, err)
	require.NotContains(t, string(b), `"name"`, "absent when empty: an older edge reads the record it knew")
}
