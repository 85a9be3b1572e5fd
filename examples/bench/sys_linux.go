package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// wantFiles is the open-file limit raiseFileLimit asks for: the memory scenario's 10,000
// connectors with TCP tunnels hold five sockets each (a control and 4 data connections).
const wantFiles = 1 << 17

// raiseFileLimit raises the open-file limit to wantFiles where it may (root), else the soft
// limit to the hard one, and returns the limit.
func raiseFileLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Max < wantFiles {
		// Raising the hard limit needs CAP_SYS_RESOURCE (root): tried, and without it the
		// soft limit is raised to the hard one only.
		want := syscall.Rlimit{Cur: wantFiles, Max: wantFiles}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			return wantFiles, nil
		}
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

// childAttrs makes the kernel kill a child edge if this process dies without closing it.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// readRSS returns VmRSS of process pid in bytes, from /proc/<pid>/status.
func readRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f := strings.Fields(rest) // "12345 kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every Linux platform Go
// supports.
const clockTicks = 100

// readCPU returns the user+system CPU time process pid has used, from /proc/<pid>/stat.
func readCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; the fields after it are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// cpuModel returns the CPU model name from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// kernelRelease returns the running kernel's release.
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// memTotal returns the machine's memory from /proc/meminfo, e.g. "23.4 GiB".
func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			if f := strings.Fields(rest); len(f) == 2 {
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					return fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	return "unknown"
}

// machineCPU returns the CPU time all processors spent in user and system mode, and the
// time stolen by the hypervisor, from /proc/stat.
func machineCPU() (busy, steal time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, errors.New("malformed /proc/stat")
	}
	var v [9]int64
	for i := 1; i < 9; i++ {
		if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("malformed /proc/stat: %w", err)
		}
	}
	tick := time.Second / clockTicks
	return time.Duration(v[1]+v[2]+v[3]) * tick, time.Duration(v[8]) * tick, nil
}

// countFDs returns how many files process pid has open, from /proc/<pid>/fd.
func countFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}
