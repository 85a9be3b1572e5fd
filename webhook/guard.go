package webhook

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrRefused is returned (wrapped) when an untrusted destination would be
// dialed at a loopback, private, link-local, unspecified or multicast
// address and SenderConfig.AllowPrivate is false. The delivery's Result is
// ResultRefused.
var ErrRefused = errors.New("webhook: refused to dial non-public address")

// thisNetwork is 0.0.0.0/8, which Linux routes to the local host.
var thisNetwork = netip.MustParsePrefix("0.0.0.0/8")

// checkDialAddr is a net.Dialer Control function: it runs after name
// resolution, on the exact address about to be dialed, so a DNS answer that
// changes between validation and connection cannot bypass it.
func checkDialAddr(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable address %q", ErrRefused, address)
	}
	ip := ap.Addr().Unmap()
	if reason := nonPublicReason(ip); reason != "" {
		return fmt.Errorf("%w: %s is %s", ErrRefused, ip, reason)
	}
	return nil
}

// nonPublicReason names why ip must not be dialed for a tenant, or returns
// "" when it may be. ip must already be unmapped.
func nonPublicReason(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return "invalid"
	case ip.IsUnspecified(), ip.Is4() && thisNetwork.Contains(ip):
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsPrivate():
		return "private"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsMulticast():
		return "multicast"
	}
	return ""
}
