//go:build !unix

package tunnel

import "net"

// peekByte cannot peek here: sniff reads the byte and replays it.
func peekByte(*net.TCPConn) (byte, bool, error) { return 0, false, nil }
