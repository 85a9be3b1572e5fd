package boltstore

import (
	"testing"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) store.Store { return mustOpen(t, t.TempDir()) })
}
