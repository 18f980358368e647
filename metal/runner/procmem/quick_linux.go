package procmem

import "os"

// Quick returns the resident memory of the calling process from /proc/self/statm: the
// kernel's running counters, read in constant time, where Self walks every mapping
// (about a millisecond per few hundred MiB mapped). The counters may lag the exact
// figure by a few hundred KiB per CPU; callers that decide near a limit read Self.
func Quick() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	return parseStatm(string(b), int64(os.Getpagesize()))
}
