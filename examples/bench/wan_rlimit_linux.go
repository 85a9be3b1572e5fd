package main

import "golang.org/x/sys/unix"

// limitRTTime sets RLIMIT_RTTIME: the kernel kills this process when, scheduled at
// real-time priority, it uses more than us microseconds of CPU without a blocking call.
func limitRTTime(us uint64) error {
	return unix.Setrlimit(unix.RLIMIT_RTTIME, &unix.Rlimit{Cur: us, Max: us})
}
