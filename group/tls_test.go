package group

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func tlsReq(sub, group, k string) JoinRequest {
	return JoinRequest{ID: nextID(), Proto: ProtoTLS, Label: sub, Group: group, KeyHash: key(k)}
}

// TestTLSPassthroughGroups: a tls pool is routed by subdomain like http (no port, in the
// subdomain namespace: an http pool cannot share it), and takes the affinities of a
// per-connection pool only.
func TestTLSPassthroughGroups(t *testing.T) {
	require.True(t, ProtoTLS.Valid())
	require.True(t, ProtoTLS.BySubdomain())
	require.True(t, ProtoTLS.PerConnection())
	require.False(t, ProtoTLS.IsHTTP(), "a tls tunnel is not proxied as HTTP")
	require.True(t, ProtoHTTPS.BySubdomain())
	require.False(t, ProtoTCP.BySubdomain())
	require.False(t, ProtoHTTP.PerConnection())

	r := lb()
	a := join(t, r, tlsReq("pool", "web", "k"))
	b := join(t, r, tlsReq("pool", "web", "k"))
	g := a.Group()
	require.Same(t, g, b.Group())
	require.Equal(t, KindHTTP, g.Kind)
	require.Equal(t, ProtoTLS, g.Proto)
	require.Equal(t, "pool", g.Label)
	require.Zero(t, g.Port, "a tls pool takes no TCP port")
	require.Zero(t, r.PortsInUse())
	require.Same(t, g, r.LookupHTTP("pool"))

	// One subdomain, one protocol.
	for _, p := range []Proto{ProtoHTTP, ProtoHTTPS} {
		req := tlsReq("pool", "web", "k")
		req.Proto = p
		_, err := r.Join(req)
		require.ErrorIs(t, err, ErrProtoMismatch)
		require.EqualError(t, err, "group: protocol mismatch: group 'web' on subdomain 'pool' serves tls, this tunnel is "+string(p))
	}
	join(t, r, httpReq("site", "web", "k"))
	_, err := r.Join(tlsReq("site", "web", "k"))
	require.ErrorIs(t, err, ErrProtoMismatch)
	join(t, r, tlsReq("solo", "", ""))
	_, err = r.Join(httpReq("solo", "", ""))
	require.EqualError(t, err, "group: subdomain 'solo' is already in use")

	_, err = r.Join(tlsReq("", "", ""))
	require.ErrorIs(t, err, ErrInvalid, "a tls tunnel needs a subdomain")

	// Affinity: client_ip only (there is no HTTP to carry a cookie or a header).
	for _, aff := range []string{"cookie", "header:X-User"} {
		req := tlsReq("sticky", "web", "k")
		req.Affinity = aff
		_, err := r.Join(req)
		require.ErrorIs(t, err, ErrInvalid, aff)
		require.ErrorContains(t, err, "a TLS passthrough pool takes client_ip")
	}
	req := tlsReq("sticky", "web", "k")
	req.Affinity = AffinityClientIP
	m := join(t, r, req)
	require.Equal(t, AffinityClientIP, m.Group().Affinity)

	// The last member leaving frees the subdomain for any protocol.
	r.Leave(a)
	r.Leave(b)
	require.Nil(t, r.LookupHTTP("pool"))
	join(t, r, httpReq("pool", "", ""))
}
