package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/store/boltstore"
)

// withStateDir is an edge file with server.state_dir set to dir.
func withStateDir(file, dir string) string {
	return strings.Replace(file, "[server]\n", fmt.Sprintf("[server]\nstate_dir = %q\n", dir), 1)
}

// TestRunStateDir: with state_dir the edge keeps route ownership in <state_dir>/warren.db,
// which it holds while it runs and lets go of when it stops; a state directory another edge
// holds, or a corrupt file, stops the edge at start (exit 2) with an error naming the file.
func TestRunStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	control, public := freePort(t), freePort(t)
	e := startRun(t, withStateDir(edgeFile(control, public, oldToken, ""), dir), control, public)
	_, err := os.Stat(filepath.Join(dir, boltstore.FileName))
	require.NoError(t, err, "the edge made its state file")

	second := filepath.Join(t.TempDir(), "server.toml")
	require.NoError(t, os.WriteFile(second, []byte(withStateDir(edgeFile(freePort(t), freePort(t), oldToken, ""), dir)), 0o600))
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", second}, &stderr))
	require.Contains(t, stderr.String(), second+": store: state directory "+dir+" is in use by another edge")

	e.cancel()
	<-e.done
	require.Equal(t, 0, e.code)
	st, err := boltstore.Open(dir)
	require.NoError(t, err, "the stopped edge let go of its state file")
	require.NoError(t, st.Close())

	bad := t.TempDir()
	file := filepath.Join(bad, boltstore.FileName)
	require.NoError(t, os.WriteFile(file, []byte("this is not a database, just garbage bytes............"), 0o600))
	require.NoError(t, os.WriteFile(second, []byte(withStateDir(edgeFile(freePort(t), freePort(t), oldToken, ""), bad)), 0o600))
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", second}, &stderr))
	require.Contains(t, stderr.String(), file+" is corrupt")
}
