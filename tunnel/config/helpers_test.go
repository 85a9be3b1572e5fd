package config_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// want describes one expected problem.
type want struct {
	line int
	key  string
	err  error  // sentinel the problem must match
	msg  string // substring of the message
}

// requireProblems checks that err is an ErrorList holding exactly the
// wanted problems, in order, all naming file.
func requireProblems(t *testing.T, err error, file string, wants ...want) {
	t.Helper()
	require.Error(t, err)
	var list config.ErrorList
	require.True(t, errors.As(err, &list), "error %T is not an ErrorList: %v", err, err)
	require.Len(t, list, len(wants), "got:\n%v", err)
	for i, w := range wants {
		e := list[i]
		require.Equal(t, file, e.File, "problem %d: %v", i, e)
		require.Equal(t, w.line, e.Line, "problem %d: %v", i, e)
		require.Equal(t, w.key, e.Key, "problem %d: %v", i, e)
		require.ErrorIs(t, e, w.err, "problem %d: %v", i, e)
		require.Contains(t, e.Msg, w.msg, "problem %d: %v", i, e)
	}
}
