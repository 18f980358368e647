package localfleet

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxLogLine bounds each line DumpLogs prints.
const maxLogLine = 600

// DumpLogs writes the last n lines of every component's log in dir (a fleet's
// LogDir) to w, for a failed run.
func DumpLogs(w io.Writer, dir string, n int) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		// Stack traces make a line kilobytes long and push the test's own output out of
		// a CI log's tail.
		for i, l := range lines {
			if len(l) > maxLogLine {
				lines[i] = l[:maxLogLine] + " …"
			}
		}
		fmt.Fprintf(w, "\n===== %s (last %d lines)\n%s\n", e.Name(), len(lines), strings.Join(lines, "\n"))
	}
}
