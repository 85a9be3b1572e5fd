//go:build unix

package boltstore

import (
	"os"
	"syscall"
)

// unlockFile drops the flock bbolt took on f.
func unlockFile(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
