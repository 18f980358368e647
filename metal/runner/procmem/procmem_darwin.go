//go:build darwin && cgo

package procmem

/*
#include <libproc.h>
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

static int mf_phys_footprint(uint64_t *out) {
	struct rusage_info_v2 ri;
	if (proc_pid_rusage(getpid(), RUSAGE_INFO_V2, (rusage_info_t *)&ri) != 0) {
		return -1;
	}
	*out = ri.ri_phys_footprint;
	return 0;
}
*/
import "C"

import "errors"

// Self returns the phys_footprint of the calling process in bytes (what Activity
// Monitor shows as Memory, including Metal buffers).
func Self() (int64, error) {
	var fp C.uint64_t
	if C.mf_phys_footprint(&fp) != 0 {
		return 0, errors.New("proc_pid_rusage failed")
	}
	return int64(fp), nil
}
