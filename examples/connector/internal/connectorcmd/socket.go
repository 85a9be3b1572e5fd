package connectorcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

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
		return "", fmt.Errorf("connector: cannot locate the default control socket (pass --socket): %w", err)
	}
	sum := sha256.Sum256([]byte(abs))
	h := hex.EncodeToString(sum[:4])
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" && filepath.IsAbs(dir) {
		return filepath.Join(dir, "warren-connector-"+h+".sock"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("connector: cannot locate the default control socket (set XDG_RUNTIME_DIR or pass --socket): %w", err)
	}
	return filepath.Join(home, ".warren", "connector-"+h+".sock"), nil
}
