package procmem

import (
	"os"
)

// Self returns the resident memory of the calling process in bytes.
func Self() (int64, error) {
	if f, err := os.Open("/proc/self/smaps_rollup"); err == nil {
		defer f.Close()
		return parseRollup(f)
	}
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	return parseStatm(string(b), int64(os.Getpagesize()))
}
