package webhook

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckDialAddr(t *testing.T) {
	refused := []string{
		"127.0.0.1:80", "127.8.9.10:443", "[::1]:80", // loopback
		"10.1.2.3:80", "172.16.0.1:80", "172.31.255.255:80", "192.168.1.1:80", // RFC 1918
		"[fc00::1]:80", "[fdff:ffff::1]:80", // unique local fc00::/7
		"169.254.169.254:80", "[fe80::1]:80", // link-local (incl. cloud metadata)
		"0.0.0.0:80", "0.1.2.3:80", "[::]:80", // unspecified / this network
		"[::ffff:127.0.0.1]:80", "[::ffff:10.0.0.1]:80", "[::ffff:169.254.1.1]:80", // IPv4-mapped
		"224.0.0.1:80", "[ff02::1]:80", // multicast
		"not-an-address",
	}
	for _, a := range refused {
		err := checkDialAddr("tcp", a, nil)
		require.Error(t, err, a)
		require.True(t, errors.Is(err, ErrRefused), a)
	}
	allowed := []string{
		"93.184.216.34:443", "8.8.8.8:80", "172.32.0.1:80", "192.169.0.1:80",
		"[2606:4700::1111]:443", "[::ffff:8.8.8.8]:80",
	}
	for _, a := range allowed {
		require.NoError(t, checkDialAddr("tcp", a, nil), a)
	}
}
