package main

import (
	"fmt"
	"os"
	"slices"
	"time"
)

// noisyCores is the CPU use by others, in cores, above which a run is flagged: the
// machines are small and shared, and another busy process skews a comparison.
const noisyCores = 0.25

// cpuMeter measures, over one run, the CPU the rest of the machine used: all the time the
// processors spent in user and system mode, minus what this process and its edge processes
// used. Kernel threads working for us (ksoftirqd) count as others, so a quiet machine shows a
// little above zero.
type cpuMeter struct {
	start             time.Time
	busy, steal, ours time.Duration
	err               error
}

// ourCPU is the CPU time of this process and of its running edge processes.
func ourCPU() (time.Duration, error) {
	d, err := readCPU(os.Getpid())
	children.Lock()
	defer children.Unlock()
	for e := range children.m {
		c, cerr := readCPU(e.PID)
		if cerr != nil {
			err = cerr
		}
		d += c
	}
	return d, err
}

func startCPUMeter() *cpuMeter {
	m := &cpuMeter{start: time.Now()}
	m.busy, m.steal, m.err = machineCPU()
	if m.err == nil {
		m.ours, m.err = ourCPU()
	}
	return m
}

// stop returns the others' CPU use and the stolen time since start, in cores.
func (m *cpuMeter) stop() (others, steal float64, err error) {
	busy, st, err := machineCPU()
	if err != nil || m.err != nil {
		return 0, 0, fmt.Errorf("measuring the machine's load: %v %v", err, m.err)
	}
	ours, err := ourCPU()
	if err != nil {
		return 0, 0, err
	}
	wall := time.Since(m.start).Seconds()
	return max(0, (busy-m.busy-(ours-m.ours)).Seconds()/wall), (st - m.steal).Seconds() / wall, nil
}

// noise is the others' CPU use during each run of a scenario.
type noise struct {
	tunnel, direct series // cores used by others
	steal          series // cores stolen by the hypervisor, over all runs
	unknown        bool   // the load could not be measured
	discarded      int    // runs run again because others used more than noisyCores
}

func (n *noise) record(mode string, others, steal float64, err error) {
	if err != nil {
		n.unknown = true
		return
	}
	if mode == "tunnel" {
		n.tunnel = append(n.tunnel, others)
	} else {
		n.direct = append(n.direct, others)
	}
	n.steal = append(n.steal, steal)
}

// note describes the machine's other load, with a warning when it may have skewed the runs.
func (n *noise) note() string {
	if n == nil || n.unknown {
		return "the machine's other load could not be measured (/proc/stat)"
	}
	f := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	s := fmt.Sprintf("CPU used by other processes and kernel threads during each run, in cores: tunnel %s; direct %s; stolen by the hypervisor: up to %.2f",
		n.tunnel.list(f), n.direct.list(f), slices.Max(append(n.steal, 0)))
	if n.discarded > 0 {
		s += fmt.Sprintf("; %d run(s) during which others used more than %.2f cores were discarded and run again", n.discarded, noisyCores)
	}
	if worst := slices.Max(append(append(slices.Clone(n.tunnel), n.direct...), 0)); worst > noisyCores {
		s += fmt.Sprintf(". WARNING: up to %.2f cores were busy with other work; the runs it overlapped are skewed (raise -noisy-retries, or re-run on a quiet machine)", worst)
	}
	return s
}
