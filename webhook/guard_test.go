package webhook

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// midAddr returns an address halfway into p.
func midAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	if i := p.Bits(); i < len(b)*8 {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// refusedAt reports whether the guard refuses to dial ip.
func refusedAt(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	err := checkDialAddr("tcp", netip.AddrPortFrom(ip, 443).String(), nil)
	if err != nil {
		require.ErrorIs(t, err, ErrRefused)
		require.Contains(t, err.Error(), ip.String(), "the refusal names the address")
	}
	return err != nil
}

// TestGuardRefusesSpecialPurposeRanges holds one row per block of the IANA IPv4 and IPv6
// Special-Purpose Address Registries that is not globally reachable (and the other non-public
// space: multicast, reserved, deprecated). The first, a middle and the last address of every
// block are refused.
func TestGuardRefusesSpecialPurposeRanges(t *testing.T) {
	for _, row := range []struct{ block, name string }{
		// IPv4 Special-Purpose Address Registry.
		{"0.0.0.0/8", "this network"},
		{"0.0.0.0/32", "this host on this network"},
		{"10.0.0.0/8", "private-use"},
		{"100.64.0.0/10", "shared address space (carrier-grade NAT; cloud metadata 100.100.100.200)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link local (cloud metadata 169.254.169.254)"},
		{"172.16.0.0/12", "private-use"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.0.0.0/29", "IPv4 service continuity prefix (DS-Lite)"},
		{"192.0.0.8/32", "IPv4 dummy address"},
		{"192.0.0.9/32", "port control protocol anycast"},
		{"192.0.0.10/32", "traversal using relays around NAT anycast"},
		{"192.0.0.170/32", "NAT64/DNS64 discovery"},
		{"192.0.0.171/32", "NAT64/DNS64 discovery"},
		{"192.0.2.0/24", "documentation (TEST-NET-1)"},
		{"192.88.99.0/24", "deprecated 6to4 relay anycast"},
		{"192.168.0.0/16", "private-use"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation (TEST-NET-2)"},
		{"203.0.113.0/24", "documentation (TEST-NET-3)"},
		{"240.0.0.0/4", "reserved"},
		{"255.255.255.255/32", "limited broadcast"},
		// Not in the registry, never a unicast receiver.
		{"224.0.0.0/4", "multicast"},

		// IPv6 Special-Purpose Address Registry. IPv4-mapped ::ffff:0:0/96, NAT64 64:ff9b::/96
		// and 6to4 2002::/16 wrap an IPv4 address and are judged by it (next test).
		{"::1/128", "loopback"},
		{"::/128", "unspecified"},
		{"64:ff9b:1::/48", "IPv4-IPv6 translation, local use"},
		{"100::/64", "discard-only"},
		{"100:0:0:1::/64", "dummy IPv6 prefix"},
		{"2001::/23", "IETF protocol assignments"},
		{"2001::/32", "Teredo"},
		{"2001:1::1/128", "port control protocol anycast"},
		{"2001:1::2/128", "traversal using relays around NAT anycast"},
		{"2001:1::3/128", "DNS-SD service registration protocol anycast"},
		{"2001:2::/48", "benchmarking"},
		{"2001:3::/32", "AMT"},
		{"2001:4:112::/48", "AS112-v6"},
		{"2001:10::/28", "deprecated (previously ORCHID)"},
		{"2001:20::/28", "ORCHIDv2"},
		{"2001:30::/28", "drone remote ID protocol entity tags"},
		{"2001:db8::/32", "documentation"},
		{"3fff::/20", "documentation"},
		{"5f00::/16", "segment routing (SRv6) SIDs"},
		{"fc00::/7", "unique-local"},
		{"fe80::/10", "link-local unicast"},
		// Not in the registry: deprecated, multicast, or reserved by the IETF.
		{"fec0::/10", "site-local (deprecated)"},
		{"ff00::/8", "multicast"},
		{"4000::/3", "reserved by the IETF"},
	} {
		t.Run(row.block, func(t *testing.T) {
			p := netip.MustParsePrefix(row.block)
			for _, ip := range []netip.Addr{p.Addr(), midAddr(p), lastAddr(p)} {
				require.True(t, refusedAt(t, ip), "%s (%s, %s) must be refused", ip, row.block, row.name)
			}
		})
	}
}

// Every IPv6 form that wraps an IPv4 address (IPv4-mapped ::ffff:0:0/96, IPv4-compatible
// ::/96, NAT64 64:ff9b::/96, 6to4 2002::/16) is judged by that IPv4 address.
func TestGuardJudgesEmbeddedIPv4ByTheIPv4Rules(t *testing.T) {
	wrap := map[string]func(v4 [4]byte) string{
		"IPv4-mapped":     func(v [4]byte) string { return "::ffff:" + netip.AddrFrom4(v).String() },
		"IPv4-compatible": func(v [4]byte) string { return "::" + netip.AddrFrom4(v).String() },
		"NAT64":           func(v [4]byte) string { return "64:ff9b::" + netip.AddrFrom4(v).String() },
		"6to4": func(v [4]byte) string {
			b := [16]byte{0x20, 0x02, v[0], v[1], v[2], v[3], 15: 1}
			return netip.AddrFrom16(b).String()
		},
	}
	private := []string{"10.1.2.3", "10.0.0.1", "255.255.255.255", "240.0.0.1", "192.0.2.1", "100.100.100.200", "100.64.0.1", "127.0.0.1", "169.254.169.254",
		"172.16.5.4", "192.168.1.1", "198.18.0.1", "198.19.255.254", "192.0.0.170", "0.0.0.0", "224.0.0.1"}
	public := []string{"8.8.8.8", "93.184.216.34", "100.63.255.255", "100.128.0.0", "198.17.255.255", "198.20.0.0"}
	for form, f := range wrap {
		for _, s := range private {
			ip := netip.MustParseAddr(f(netip.MustParseAddr(s).As4()))
			require.True(t, refusedAt(t, ip), "%s %s wraps %s", form, ip, s)
		}
		for _, s := range public {
			ip := netip.MustParseAddr(f(netip.MustParseAddr(s).As4()))
			require.False(t, refusedAt(t, ip), "%s %s wraps the public %s", form, ip, s)
		}
	}
}

// Public addresses, including the neighbours of refused blocks, are dialed.
func TestGuardAllowsPublicAddresses(t *testing.T) {
	for _, s := range []string{
		"8.8.8.8", "1.1.1.1", "93.184.216.34",
		"9.255.255.255", "11.0.0.0", // around 10/8
		"100.63.255.255", "100.128.0.0", // around 100.64/10
		"172.15.255.255", "172.32.0.0", // around 172.16/12
		"192.0.1.255", "192.0.3.0", "192.88.98.255", "192.88.100.0", "192.167.255.255", "192.169.0.0",
		"198.17.255.255", "198.20.0.0", "198.51.99.255", "198.51.101.0", "203.0.112.255", "203.0.114.0",
		"223.255.255.255",
		"2606:4700::1111", "2a00:1450:4001::1", "2001:200::1", "2001:db7:ffff::1", "2001:db9::1",
		"2003::1", "3ffe:ffff::1", "3fff:1000::1",
		"2620:4f:8000::1", // AS112 direct delegation: globally reachable
	} {
		require.False(t, refusedAt(t, netip.MustParseAddr(s)), s)
	}
}

func TestCheckDialAddr(t *testing.T) {
	refused := []string{
		"127.0.0.1:80", "[::1]:80", "[fe80::1%eth0]:80", "[::ffff:127.0.0.1]:80",
		"not-an-address", "example.com:80",
	}
	for _, a := range refused {
		err := checkDialAddr("tcp", a, nil)
		require.Error(t, err, a)
		require.True(t, errors.Is(err, ErrRefused), a)
	}
	for _, a := range []string{"93.184.216.34:443", "[2606:4700::1111]:443", "[::ffff:8.8.8.8]:80"} {
		require.NoError(t, checkDialAddr("tcp", a, nil), a)
	}
}

// A tenant URL on carrier-grade NAT space (cloud metadata) or on NAT64 wrapping a private
// address is refused at dial time, before any packet leaves.
func TestSenderRefusesTenantURLsOnSpecialAddresses(t *testing.T) {
	rec := newRecorder(2)
	s := NewSender(SenderConfig{OnResult: rec.hook})
	defer s.Close()
	s.Send([]Destination{{URL: "http://100.100.100.200/latest/meta-data"}, {URL: "http://[64:ff9b::a00:1]:8080/x"}}, samplePayload())
	for range 2 {
		o := rec.next(t)
		require.Equal(t, ResultRefused, o.result)
		require.ErrorIs(t, o.err, ErrRefused)
	}
}
