// Package procmem measures the runner's own memory footprint: Rss from
// /proc/self/smaps_rollup (or /proc/self/statm) on Linux, phys_footprint from
// proc_pid_rusage on darwin. The agent measures runners from outside as well and
// trusts its own figure; this one is what the runner reports and enforces its
// ceiling with.
package procmem

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// parseRollup returns the Rss line of a smaps_rollup file, in bytes.
func parseRollup(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "Rss:") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			return 0, fmt.Errorf("unexpected smaps_rollup line %q", line)
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected smaps_rollup line %q: %w", line, err)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no Rss line in smaps_rollup")
}

// parseStatm returns the resident size of a statm file, in bytes.
func parseStatm(s string, pageSize int64) (int64, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0, fmt.Errorf("unexpected statm %q", s)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("unexpected statm %q: %w", s, err)
	}
	return pages * pageSize, nil
}
