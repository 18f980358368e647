package hardware

import "golang.org/x/sys/unix"

// perfLevel0Cores are the performance cores of Apple silicon (perflevel0), else all
// physical cores; 0 when neither sysctl answers.
func perfLevel0Cores() int {
	for _, name := range []string{"hw.perflevel0.physicalcpu", "hw.physicalcpu"} {
		if n, err := unix.SysctlUint32(name); err == nil && n > 0 {
			return int(n)
		}
	}
	return 0
}
