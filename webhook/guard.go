package webhook

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrRefused is returned (wrapped) when an untrusted destination would be
// dialed at an address that is not globally reachable and
// SenderConfig.AllowPrivate is false. The delivery's Result is ResultRefused.
// Refused are every block of the IANA IPv4 and IPv6 Special-Purpose Address
// Registries that is not globally reachable (loopback, private-use, shared
// address space 100.64.0.0/10, link-local, documentation, benchmarking,
// unique-local, Teredo, ...), multicast, reserved space, IPv6 outside
// 2000::/3, and the IPv6 forms that wrap a refused IPv4 address
// (::ffff:a.b.c.d, ::a.b.c.d, NAT64 64:ff9b::a.b.c.d, 6to4 2002:aabb:ccdd::).
var ErrRefused = errors.New("webhook: refused to dial non-public address")

// addrRange is one block of addresses an untrusted destination must not be
// dialed at, and why.
type addrRange struct {
	prefix netip.Prefix
	name   string
}

func block(prefix, name string) addrRange {
	return addrRange{netip.MustParsePrefix(prefix), name}
}

// refusedIPv4 holds every block of the IANA IPv4 Special-Purpose Address
// Registry that is not globally reachable, plus multicast and the reserved
// class E space. 192.0.0.0/24 is refused whole: its few globally reachable
// entries (PCP and TURN anycast) answer from a server near the edge, never
// from a webhook receiver. 192.88.99.0/24 (the deprecated 6to4 relay anycast
// block) is refused for the same reason.
var refusedIPv4 = []addrRange{
	block("0.0.0.0/8", "this network"),
	block("10.0.0.0/8", "private-use"),
	block("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
	block("127.0.0.0/8", "loopback"),
	block("169.254.0.0/16", "link-local"),
	block("172.16.0.0/12", "private-use"),
	block("192.0.0.0/24", "IETF protocol assignments"),
	block("192.0.2.0/24", "documentation"),
	block("192.88.99.0/24", "deprecated 6to4 relay anycast"),
	block("192.168.0.0/16", "private-use"),
	block("198.18.0.0/15", "benchmarking"),
	block("198.51.100.0/24", "documentation"),
	block("203.0.113.0/24", "documentation"),
	block("224.0.0.0/4", "multicast"),
	block("240.0.0.0/4", "reserved"), // includes 255.255.255.255, the limited broadcast address
}

// The IPv6 blocks whose addresses wrap an IPv4 address that the packet ends
// up at: such an address is refused when the IPv4 address is. ::ffff:0:0/96
// (IPv4-mapped) is handled by unmapping.
var (
	ipv4Compatible = netip.MustParsePrefix("::/96")        // deprecated IPv4-compatible ::a.b.c.d
	nat64          = netip.MustParsePrefix("64:ff9b::/96") // NAT64 well-known prefix 64:ff9b::a.b.c.d
	sixToFour      = netip.MustParsePrefix("2002::/16")    // 6to4: 2002:aabb:ccdd::/48 wraps a.b.c.d
)

// globalUnicast is the only IPv6 space IANA allocates for unicast.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// refusedIPv6 holds every block of the IANA IPv6 Special-Purpose Address
// Registry that is not globally reachable, plus site-local and multicast.
// Anything else outside 2000::/3 (all of it reserved by the IETF or listed
// here) is refused as well, except the IPv4-embedding blocks, whose IPv4
// address decides. 2001::/23 is refused whole: Teredo (2001::/32), whose
// client address is obfuscated and reached through a relay, benchmarking,
// ORCHID, and the anycast and AS112 entries, none of which is a webhook
// receiver.
var refusedIPv6 = []addrRange{
	block("::/128", "unspecified"),
	block("::1/128", "loopback"),
	block("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
	block("100::/64", "discard-only"),
	block("100:0:0:1::/64", "dummy prefix"),
	block("2001::/23", "IETF protocol assignments (Teredo, benchmarking, ORCHID, anycast)"),
	block("2001:db8::/32", "documentation"),
	block("3fff::/20", "documentation"),
	block("5f00::/16", "segment routing (SRv6) SIDs"),
	block("fc00::/7", "unique-local"),
	block("fe80::/10", "link-local"),
	block("fec0::/10", "site-local (deprecated)"),
	block("ff00::/8", "multicast"),
}

// checkDialAddr is a net.Dialer Control function: it runs after name
// resolution, on the exact address about to be dialed, so a DNS answer that
// changes between validation and connection cannot bypass it. It refuses
// every address that nonPublicReason names.
func checkDialAddr(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable address %q", ErrRefused, address)
	}
	if reason := nonPublicReason(ap.Addr()); reason != "" {
		return fmt.Errorf("%w: %s is %s", ErrRefused, ap.Addr(), reason)
	}
	return nil
}

// nonPublicReason names why ip must not be dialed for a tenant, or returns
// "" when it may be. The rules:
//
//   - IPv4: refused when in refusedIPv4.
//   - IPv6 that wraps an IPv4 address the packet is delivered to
//     (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64
//     64:ff9b::a.b.c.d, 6to4 2002:aabb:ccdd::): refused when that IPv4
//     address is.
//   - Other IPv6: refused when in refusedIPv6 or outside 2000::/3.
//
// A zone (fe80::1%eth0) does not change the verdict.
func nonPublicReason(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.WithZone("")
	if ip.Is4In6() {
		return embedded("IPv4-mapped", ip.Unmap())
	}
	if ip.Is4() {
		for _, b := range refusedIPv4 {
			if b.prefix.Contains(ip) {
				return b.name
			}
		}
		return ""
	}
	for _, b := range refusedIPv6 {
		if b.prefix.Contains(ip) {
			return b.name
		}
	}
	switch {
	case ipv4Compatible.Contains(ip):
		return embedded("IPv4-compatible", last32(ip))
	case nat64.Contains(ip):
		return embedded("NAT64", last32(ip))
	case sixToFour.Contains(ip):
		b := ip.As16()
		return embedded("6to4", netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
	}
	if !globalUnicast.Contains(ip) {
		return "outside the global unicast space"
	}
	return ""
}

// embedded applies the IPv4 rules to the IPv4 address v4 wrapped in an IPv6
// address of the given form.
func embedded(form string, v4 netip.Addr) string {
	if reason := nonPublicReason(v4); reason != "" {
		return fmt.Sprintf("%s %s (%s)", form, v4, reason)
	}
	return ""
}

// last32 returns the IPv4 address in the last 32 bits of ip.
func last32(ip netip.Addr) netip.Addr {
	b := ip.As16()
	return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
}
