//go:build !unix

package boltstore

import "os"

// unlockFile does nothing here: closing the file releases bbolt's lock.
func unlockFile(*os.File) {}
