//go:build !linux

package main

import (
	"errors"
	"runtime"
	"syscall"
	"time"
)

// errNotLinux: the memory and CPU figures come from /proc.
var errNotLinux = errors.New("only available on Linux (/proc)")

func raiseFileLimit() (uint64, error) { return 1 << 20, nil }

func childAttrs() *syscall.SysProcAttr { return nil }

func readRSS(int) (int64, error) { return 0, errNotLinux }

func readCPU(int) (time.Duration, error) { return 0, errNotLinux }

func cpuModel() string { return runtime.GOARCH }

func kernelRelease() string { return runtime.GOOS }

func memTotal() string { return "unknown" }

func machineCPU() (busy, steal time.Duration, err error) { return 0, 0, errNotLinux }

func countFDs(int) (int, error) { return 0, nil }
