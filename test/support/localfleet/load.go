package localfleet

import (
	"os/exec"
	"strings"
)

// LoadAverage is the load average line of uptime(1) ("load average: 1.02, 0.98,
// 0.91"), for a benchmark to print beside its figures: these machines are shared.
func LoadAverage() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	s := strings.TrimSpace(string(out))
	if i := strings.Index(s, "load average"); i >= 0 {
		return s[i:]
	}
	return s
}
