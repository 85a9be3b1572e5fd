//go:build !linux

package main

// limitRTTime does nothing off Linux, where the WAN scenario does not run.
func limitRTTime(uint64) error { return nil }
