package boltstore

import (
	"os"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

// BenchmarkBoltUpdate is one durable (fsynced) transaction per op, in b.TempDir().
func BenchmarkBoltUpdate(b *testing.B) {
	s := mustOpen(b, b.TempDir())
	defer s.Close()
	storetest.BenchUpdate(b, s)
}

// benchRoutes is the size of the store that BenchmarkBoltOpen and BenchmarkBoltCheck read.
const benchRoutes = 10_000

// BenchmarkBoltOpen measures Open of a store of 10,000 routes: opening, decoding every route
// and bbolt's consistency check.
func BenchmarkBoltOpen(b *testing.B) {
	dir := b.TempDir()
	writeDB(b, dir, benchRoutes)
	for b.Loop() {
		s, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

// BenchmarkBoltCheck measures, one by one, the checks Open makes of a store of 10,000
// routes: bbolt's tx.Check, the page-structure validation, and decoding every route.
func BenchmarkBoltCheck(b *testing.B) {
	s := mustOpen(b, b.TempDir())
	defer s.Close()
	if err := fill(s, benchRoutes); err != nil {
		b.Fatal(err)
	}
	view := func(b *testing.B, fn func(tx *bolt.Tx) error) {
		for b.Loop() {
			if err := s.db.View(fn); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("tx.Check", func(b *testing.B) {
		view(b, func(tx *bolt.Tx) error { return checkTx(s.path, tx) })
	})
	b.Run("validatePages", func(b *testing.B) {
		f, err := os.Open(s.path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		view(b, func(tx *bolt.Tx) error {
			ps := tx.DB().Info().PageSize
			return validatePages(f, ps, uint64(tx.Size())/uint64(ps), uint64(tx.Cursor().Bucket().RootPage()))
		})
	})
	b.Run("decode", func(b *testing.B) {
		view(b, func(tx *bolt.Tx) error {
			return tx.Bucket(routesBucket).ForEach(func(k, v []byte) error {
				_, err := decodeRoute(s.path, k, v)
				return err
			})
		})
	})
}
