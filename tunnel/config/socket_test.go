package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestControlSocketKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yml")
	doc := "server: localhost:4040\ncontrol_socket: run/c.sock\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConnector(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "run", "c.sock"); c.ControlSocket != want {
		t.Fatalf("control_socket = %q, want %q (relative to the file)", c.ControlSocket, want)
	}

	long := "/" + strings.Repeat("s", MaxSocketPathLen)
	_, err = ParseConnector("config.yml", []byte("server: localhost:4040\ncontrol_socket: "+long+"\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"))
	if err == nil || !strings.Contains(err.Error(), "config.yml:2: control_socket: is 105 bytes long") {
		t.Fatalf("a too long socket path: got %v", err)
	}
}
