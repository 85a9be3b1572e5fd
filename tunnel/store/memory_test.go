package store_test

import (
	"testing"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(testing.TB) store.Store { return store.NewMemory() })
}

func BenchmarkMemoryUpdate(b *testing.B) { storetest.BenchUpdate(b, store.NewMemory()) }
