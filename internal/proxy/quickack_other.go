//go:build !linux

package proxy

import "net"

// QuickAck does nothing outside Linux (see quickack_linux.go).
func QuickAck(net.Conn) {}
