//go:build linux

package pgcoord

import (
	"syscall"
	"unsafe"
)

const clockMonotonic = 1 // CLOCK_MONOTONIC in <time.h>

// monoMillis reads CLOCK_MONOTONIC in milliseconds: the clock the agent's
// valid_until_mono_ms is a reading of. Go's own monotonic readings have an
// unspecified origin, so they cannot be compared with the agent's.
func monoMillis() int64 {
	var ts syscall.Timespec
	_, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic,
		uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		panic("pgcoord: clock_gettime(CLOCK_MONOTONIC): " + errno.Error())
	}
	return int64(ts.Sec)*1000 + int64(ts.Nsec)/1000000
}
