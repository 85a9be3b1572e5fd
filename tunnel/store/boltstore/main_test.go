package boltstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them (bbolt's consistency
// check runs in one, which Open must drain).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
