package connectorcmd

import (
	"strings"
	"testing"
)

func TestDefaultControlSocket(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	p, err := DefaultControlSocket("/etc/warren/a.yml")
	if err != nil || !strings.HasPrefix(p, "/run/user/1000/warren-connector-") || !strings.HasSuffix(p, ".sock") {
		t.Fatalf("with XDG_RUNTIME_DIR: %q, %v", p, err)
	}
	if q, _ := DefaultControlSocket("/etc/warren/a.yml"); q != p {
		t.Fatalf("one file, two sockets: %q and %q", p, q)
	}
	if q, _ := DefaultControlSocket("/etc/warren/b.yml"); q == p {
		t.Fatalf("two files share the socket %q", p)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("HOME", "/home/u")
	p, err = DefaultControlSocket("/etc/warren/a.yml")
	if err != nil || !strings.HasPrefix(p, "/home/u/.warren/connector-") || len(p) != len("/home/u/.warren/connector-12345678.sock") {
		t.Fatalf("without XDG_RUNTIME_DIR: %q, %v", p, err)
	}
}
