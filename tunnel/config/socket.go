package config

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
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

// controlSocketLine finds a top-level control_socket key in YAML text that does not parse.
var controlSocketLine = regexp.MustCompile(`(?m)^control_socket:[ \t]*(.*?)[ \t]*(?:#.*)?$`)

// ConnectorControlSocket returns the control_socket that the connector file at path sets
// (a relative path resolved against the file's directory), or "" when it sets none. It
// reads that key alone and nothing else, so that the commands that talk to a running
// connector (status, reload) find its socket while the file has errors elsewhere: a
// half-edited file, or one whose YAML does not parse (the key is then looked for as a
// top-level line). Only a file that cannot be read is an error.
func ConnectorControlSocket(path string) (string, error) {
	data, err := readFile(path)
	if err != nil {
		return "", err
	}
	var socket string
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) == nil {
		if len(doc.Content) > 0 && doc.Content[0].Kind == yaml.MappingNode {
			m := doc.Content[0]
			for i := 0; i+1 < len(m.Content); i += 2 {
				if k, v := m.Content[i], m.Content[i+1]; k.Value == "control_socket" && v.Kind == yaml.ScalarNode {
					socket = v.Value
				}
			}
		}
	} else if m := controlSocketLine.FindSubmatch(data); m != nil {
		socket = string(m[1])
		if uq, err := strconv.Unquote(socket); err == nil {
			socket = uq
		} else if len(socket) >= 2 && socket[0] == '\'' && socket[len(socket)-1] == '\'' {
			socket = strings.ReplaceAll(socket[1:len(socket)-1], "''", "'")
		}
	}
	if controlSocketProblem(socket) != "" {
		return "", nil // not a usable path: the default socket is the best guess
	}
	return resolvePath(filepath.Dir(path), socket), nil
}
