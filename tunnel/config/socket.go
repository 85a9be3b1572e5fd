package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MaxSocketPathLen is the longest control socket path accepted: a Unix
// socket's address holds at most 104 bytes on BSD and macOS (108 on Linux).
const MaxSocketPathLen = 104

// DefaultControlSocket returns the connector's default control socket for
// the configuration file at configPath: warren-connector-<h>.sock in
// $XDG_RUNTIME_DIR when that is set (a directory only its user can enter),
// else connector-<h>.sock in ~/.warren, where <h> is the first 8 hex digits
// of the SHA-256 of the file's absolute path. Connectors of different files
// thus get different sockets, and the commands that talk to a connector find
// its socket from the same --config.
func DefaultControlSocket(configPath string) (string, error) {
	abs, err := filepath.Abs(configPath)
	if err != nil {
		return "", fmt.Errorf("config: cannot locate the default control socket (pass --socket): %w", err)
	}
	sum := sha256.Sum256([]byte(abs))
	h := hex.EncodeToString(sum[:4])
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" && filepath.IsAbs(dir) {
		return filepath.Join(dir, "warren-connector-"+h+".sock"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("config: cannot locate the default control socket (set XDG_RUNTIME_DIR or pass --socket): %w", err)
	}
	return filepath.Join(home, ".warren", "connector-"+h+".sock"), nil
}

// controlSocketProblem says why p cannot be a control socket path, or
// returns "" (also for "", meaning the default).
func controlSocketProblem(p string) string {
	switch {
	case p == "":
		return ""
	case len(p) > MaxSocketPathLen:
		return fmt.Sprintf("is %d bytes long; a Unix socket path has at most %d", len(p), MaxSocketPathLen)
	case strings.ContainsRune(p, 0):
		return "must not contain a NUL byte"
	case strings.HasSuffix(p, "/"):
		return fmt.Sprintf("%q names a directory; give the socket's file path", p)
	}
	return ""
}
