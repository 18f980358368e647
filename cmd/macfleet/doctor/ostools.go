package doctor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Tools reads what the operating system's own tools say, for the figures the agent's
// gauge measures to be shown beside them. It is a seam: tests give canned outputs.
type Tools interface {
	// ReadFile reads a file such as /proc/meminfo.
	ReadFile(name string) ([]byte, error)
	// Output runs a command such as vm_stat and returns its standard output.
	Output(ctx context.Context, name string, args ...string) ([]byte, error)
}

// SystemTools reads the real files and runs the real commands.
type SystemTools struct{}

// ReadFile is os.ReadFile.
func (SystemTools) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// Output runs name with args and returns its standard output; a failure includes
// the first line of its standard error.
func (SystemTools) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && len(ee.Stderr) > 0 {
		line, _, _ := strings.Cut(strings.TrimSpace(string(ee.Stderr)), "\n")
		return out, fmt.Errorf("%s: %w: %s", name, err, line)
	}
	if err != nil {
		return out, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// meminfoBytes returns the named fields of /proc/meminfo ("MemTotal: 16384 kB") in
// bytes. A field that is absent or does not parse is an error.
func meminfoBytes(b []byte, keys ...string) (map[string]int64, error) {
	found := make(map[string]int64, len(keys))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var key string
		var kib int64
		if n, _ := fmt.Sscanf(sc.Text(), "%s %d kB", &key, &kib); n == 2 {
			found[strings.TrimSuffix(key, ":")] = kib << 10
		}
	}
	out := make(map[string]int64, len(keys))
	for _, k := range keys {
		v, ok := found[k]
		if !ok {
			return nil, fmt.Errorf("no %s line", k)
		}
		out[k] = v
	}
	return out, nil
}

// procStatusRSS returns VmRSS of /proc/PID/status in bytes.
func procStatusRSS(b []byte) (int64, error) {
	m, err := meminfoBytes(b, "VmRSS")
	if err != nil {
		return 0, err
	}
	return m["VmRSS"], nil
}

// zoneinfoPCPPages adds up the "count:" lines of /proc/zoneinfo: the free pages held
// on the per-CPU lists of every zone. Lines that do not parse count as zero.
func zoneinfoPCPPages(b []byte) int64 {
	var pages int64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "count:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			pages += max(n, 0)
		}
	}
	return pages
}

// vmStatHeader is the first line of vm_stat: "Mach Virtual Memory Statistics: (page
// size of 16384 bytes)".
var vmStatHeader = regexp.MustCompile(`page size of (\d+) bytes`)

// vmStat is one run of macOS's vm_stat: its page size and its counters, keyed by
// the label before the colon ("Pages wired down", "Anonymous pages").
type vmStat struct {
	pageSize int64
	pages    map[string]int64
}

func parseVMStat(b []byte) (vmStat, error) {
	m := vmStatHeader.FindSubmatch(b)
	if m == nil {
		return vmStat{}, fmt.Errorf("no page size in the vm_stat header")
	}
	vs := vmStat{pages: map[string]int64{}}
	vs.pageSize, _ = strconv.ParseInt(string(m[1]), 10, 64)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		label, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), "."), 10, 64)
		if err != nil {
			continue // the header, or a counter vm_stat prints in another form
		}
		vs.pages[strings.Trim(strings.TrimSpace(label), `"`)] = n
	}
	if vs.pageSize <= 0 || len(vs.pages) == 0 {
		return vmStat{}, fmt.Errorf("no counters in the vm_stat output")
	}
	return vs, nil
}

// vm_stat labels of the counters Activity Monitor's "Memory Used" adds up.
const (
	vmAnonymous  = "Anonymous pages"
	vmPurgeable  = "Pages purgeable"
	vmWired      = "Pages wired down"
	vmCompressor = "Pages occupied by compressor"
)

// usedBytes is Activity Monitor's "Memory Used" from vm_stat's own counters: app
// memory (anonymous pages that are not purgeable) + wired + compressor. It is the
// definition the agent's darwin gauge applies to host_statistics64, computed here
// from another source so that a misread counter shows up as a difference.
func (vs vmStat) usedBytes() (int64, error) {
	for _, k := range []string{vmAnonymous, vmPurgeable, vmWired, vmCompressor} {
		if _, ok := vs.pages[k]; !ok {
			return 0, fmt.Errorf("vm_stat printed no %q", k)
		}
	}
	app := max(vs.pages[vmAnonymous]-vs.pages[vmPurgeable], 0)
	return (app + vs.pages[vmWired] + vs.pages[vmCompressor]) * vs.pageSize, nil
}

// memoryPressureFree is memory_pressure's "System-wide memory free percentage: 62%".
var memoryPressureFree = regexp.MustCompile(`System-wide memory free percentage:\s*(\d+)%`)

func parseMemoryPressure(b []byte) (int64, error) {
	m := memoryPressureFree.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no \"System-wide memory free percentage\" line")
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// parseInt parses the output of `sysctl -n NAME` or `ps -o rss= -p PID`.
func parseInt(b []byte) (int64, error) {
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
