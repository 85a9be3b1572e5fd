package config

import (
	"fmt"
	"strings"
)

// MaxSocketPathLen is the longest control socket path accepted: a Unix
// socket's address holds at most 104 bytes on BSD and macOS (108 on Linux).
const MaxSocketPathLen = 104

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
