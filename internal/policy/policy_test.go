package policy

import (
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestAllowAndDeny(t *testing.T) {
	g := New(Rules{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
		Deny: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}})
	for _, c := range []struct {
		ip string
		ok bool
	}{{"10.2.3.4", true}, {"10.1.2.3", false}, {"192.0.2.1", false}, {"2001:db8::1", true}, {"::ffff:10.2.3.4", true}, {"::ffff:10.1.0.1", false}} {
		done, ref := g.Admit(addr(c.ip))
		if c.ok {
			require.Nil(t, ref, c.ip)
			done()
		} else {
			require.Nil(t, done, c.ip)
			require.Equal(t, http.StatusForbidden, ref.Status, c.ip)
		}
	}
}

func TestRatePerClient(t *testing.T) {
	now := time.Unix(1000, 0)
	g := New(Rules{Rate: 2, Burst: 3})
	g.now = func() time.Time { return now }
	for range 3 {
		done, ref := g.Admit(addr("192.0.2.1"))
		require.Nil(t, ref)
		done()
	}
	_, ref := g.Admit(addr("192.0.2.1"))
	require.NotNil(t, ref, "the burst is spent")
	require.Equal(t, http.StatusTooManyRequests, ref.Status)
	require.Equal(t, time.Second, ref.RetryAfter)
	_, ref = g.Admit(addr("192.0.2.2"))
	require.Nil(t, ref, "another client has its own bucket")
	now = now.Add(500 * time.Millisecond)
	_, ref = g.Admit(addr("192.0.2.1"))
	require.Nil(t, ref, "one token refilled at 2/s")
}

func TestMaxConcurrent(t *testing.T) {
	g := New(Rules{MaxConcurrent: 2})
	d1, _ := g.Admit(addr("192.0.2.1"))
	d2, _ := g.Admit(addr("192.0.2.2"))
	_, ref := g.Admit(addr("192.0.2.3"))
	require.Equal(t, http.StatusServiceUnavailable, ref.Status)
	d1()
	d1() // done is idempotent
	d3, ref := g.Admit(addr("192.0.2.3"))
	require.Nil(t, ref)
	_, ref = g.Admit(addr("192.0.2.4"))
	require.NotNil(t, ref, "a second done does not free a second slot")
	d2()
	d3()
}

// However many addresses it sees, a gate keeps a bounded number of limiters.
func TestClientsAreBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	g := New(Rules{Rate: 1, Burst: 1})
	g.now = func() time.Time { return now }
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range maxClients {
				a := netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 8), byte(i)})
				g.Admit(a)
			}
		})
	}
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	require.LessOrEqual(t, len(g.clients), maxClients)
}
