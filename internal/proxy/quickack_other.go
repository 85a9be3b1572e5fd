//go:build !linux

package proxy

import "net"

// QuickAck does nothing outside Linux (see quickack_linux.go).
func QuickAck(net.Conn) {}

// clampWindow does nothing outside Linux and reports the buffer asked for.
func clampWindow(_ *net.TCPConn, n int) int { return n }
