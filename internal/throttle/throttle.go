// Package throttle bounds what clients that have not authenticated can cost an edge.
//
// Auth throttles failed authentications per source address: once an address has failed,
// each of its further attempts waits before its token is checked, and once it has failed too
// often within a window it is refused for a while without its token being checked at all.
// Conns caps the connections still waiting to authenticate, in total and per source address.
// Both log in aggregate, at most one line per address per interval with counts, never a line
// per attempt.
//
// Addresses are grouped by Key: an IPv4 address, or the /64 prefix of an IPv6 address (one
// host or site is usually given a whole /64). Memory is bounded: Auth remembers at most
// AuthConfig.MaxKeys addresses and forgets the least recently seen first; Conns holds an entry
// only per address with a connection waiting, so at most its total cap.
package throttle

import (
	"math"
	"net"
	"net/netip"
	"time"

	"go.uber.org/zap"
)

// Key is a source address as it is throttled: an IPv4 address or an IPv6 /64 prefix. The
// zero Key stands for an address that is not an IP address (an in-memory pipe): it is never
// throttled on its own.
type Key struct{ p netip.Prefix }

// KeyOf returns the Key of a connection's remote address, or the zero Key when it is not an
// IP address.
func KeyOf(a net.Addr) Key {
	switch a := a.(type) {
	case nil:
		return Key{}
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return KeyOfIP(ip)
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return KeyOfIP(ip)
	}
	return KeyOfString(a.String())
}

// KeyOfString returns the Key of "host:port" or of a bare IP address (as in
// http.Request.RemoteAddr), or the zero Key when it holds no IP address.
func KeyOfString(s string) Key {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return KeyOfIP(ap.Addr())
	}
	ip, _ := netip.ParseAddr(s)
	return KeyOfIP(ip)
}

// KeyOfIP returns the Key of ip: ip itself for IPv4 (and IPv4-mapped IPv6), its /64 for
// IPv6. The zone is ignored; the invalid Addr gives the zero Key.
func KeyOfIP(ip netip.Addr) Key {
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() {
		return Key{}
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return Key{p}
}

// IsZero reports whether k is the zero Key (no IP address).
func (k Key) IsZero() bool { return !k.p.IsValid() }

// String returns the IPv4 address, or the IPv6 prefix ("2001:db8:1:2::/64").
func (k Key) String() string {
	switch {
	case !k.p.IsValid():
		return "non-IP address"
	case k.p.Addr().Is4():
		return k.p.Addr().String()
	}
	return k.p.String()
}

// line is one log line, written once the lock that collected it is released.
type line struct {
	msg    string
	fields []zap.Field
}

func emit(log *zap.Logger, lines []line) {
	for _, l := range lines {
		log.Warn(l.msg, l.fields...)
	}
}

// RoundUp returns d rounded up to a whole second, at least one second: the form a retry
// delay is told in (an HTTP Retry-After is whole seconds).
func RoundUp(d time.Duration) time.Duration {
	return time.Duration(max(1, math.Ceil(d.Seconds()))) * time.Second
}
