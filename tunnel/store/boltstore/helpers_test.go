package boltstore

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

func mustOpen(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

// writeDB makes dir/warren.db a store holding n routes (written in one transaction).
func writeDB(t testing.TB, dir string, n int) string {
	t.Helper()
	s := mustOpen(t, dir)
	if err := fill(s, n); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, FileName)
}

// fill writes n routes to s in one transaction.
func fill(s *Store, n int) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(routesBucket)
		for i := range n {
			r := storetest.SampleRoute(fmt.Sprintf("route-%06d", i))
			data, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := bk.Put([]byte(r.Key()), data); err != nil {
				return err
			}
		}
		return nil
	})
}

// rawUpdate changes dir/warren.db with bbolt directly.
func rawUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
