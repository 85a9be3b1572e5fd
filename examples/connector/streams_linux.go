package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// openConns counts, per remote address, the TCP connections this process holds open (a file
// descriptor of its own, in any state but LISTEN). A Forward tunnel dials its local target
// afresh for each stream and holds that connection until the stream ends, so the
// connections to a tunnel's target are its open streams (idle keep-alive ones included; a
// health probe's connection counts for an instant).
func openConns() (map[netip.AddrPort]int, error) {
	inodes, err := socketInodes()
	if err != nil {
		return nil, err
	}
	out := map[netip.AddrPort]int{}
	for _, name := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		if err := scanTCP(name, inodes, out); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	return out, nil
}

// socketInodes returns the inodes of the sockets among this process's file descriptors.
func socketInodes() (map[string]bool, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	inodes := make(map[string]bool, len(ents))
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if rest, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(rest, "]")] = true
		}
	}
	return inodes, nil
}

// scanTCP adds the connections of one /proc/net/tcp{,6} table whose inode is in inodes.
func scanTCP(name string, inodes map[string]bool, out map[netip.AddrPort]int) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[3] == "0A" || !inodes[fs[9]] { // 0A: LISTEN
			continue
		}
		if ap, ok := parseProcAddr(fs[2]); ok {
			out[ap]++
		}
	}
	return sc.Err()
}

// parseProcAddr parses an address of /proc/net/tcp{,6}: the address as 32-bit words in
// host byte order, in hex, a colon, and the port in hex. An IPv4-mapped IPv6 address is
// returned as IPv4.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(hexAddr)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	ip := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}
