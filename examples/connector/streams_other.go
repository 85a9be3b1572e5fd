//go:build !linux

package main

import (
	"errors"
	"net/netip"
)

// openConns is not available on this system: stream counts are shown as unknown.
func openConns() (map[netip.AddrPort]int, error) {
	return nil, errors.ErrUnsupported
}
