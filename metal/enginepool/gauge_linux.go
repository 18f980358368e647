package enginepool

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
)

// NewGauge returns the gauge of this operating system: on Linux a ProcGauge over /proc.
func NewGauge() (Gauge, error) {
	return NewProcGauge(os.DirFS("/proc"), "/proc", int64(os.Getpagesize())), nil
}

// ProcGauge measures memory from a Linux procfs: MemTotal and MemAvailable from
// meminfo plus the pages on the per-CPU free lists from zoneinfo, the CPU model and core count from cpuinfo, and a process's resident set
// from smaps_rollup (statm when smaps_rollup cannot be read). There is no Metal on
// Linux, so the Metal working set, wired limit and GPU cores are zero.
type ProcGauge struct {
	fsys     fs.FS
	root     string
	pageSize int64
}

// NewProcGauge reads procfs from fsys (os.DirFS("/proc") in production, an fstest.MapFS
// in tests). root is only used to name files in errors; pageSize is the unit of statm.
func NewProcGauge(fsys fs.FS, root string, pageSize int64) *ProcGauge {
	return &ProcGauge{fsys: fsys, root: root, pageSize: pageSize}
}

var _ Gauge = (*ProcGauge)(nil)

// Hardware reports MemTotal as the total memory, the CPU model as Chip and the number
// of physical cores (distinct physical id/core id pairs; logical processors when the
// kernel does not report cores). cpuinfo is informational: when it cannot be read or
// parsed, Chip and CPUCores are left zero rather than failing the whole report.
func (g *ProcGauge) Hardware() (Hardware, error) {
	mi, err := g.meminfo("hardware")
	if err != nil {
		return Hardware{}, err
	}
	total, err := g.meminfoField("hardware", mi, "MemTotal")
	if err != nil {
		return Hardware{}, err
	}
	hw := Hardware{TotalBytes: total}
	if b, err := fs.ReadFile(g.fsys, "cpuinfo"); err == nil {
		hw.Chip, hw.CPUCores = parseCPUInfo(b)
	}
	return hw, nil
}

// Host reports MemTotal, Available and Used = Total − Available, where Available is
// MemAvailable plus the free pages held on the per-CPU page lists (the "count:" lines
// of zoneinfo's pagesets). Pages a process gives back go to those lists first, and
// meminfo does not count them as free until the kernel drains them into the buddy
// allocator; recent kernels size the lists by free memory (high_max of hundreds of MB
// per CPU) and drain them over seconds, so MemAvailable alone showed ~30% of a 700 MB
// runner's exit at once and the rest only slowly. Without a readable zoneinfo the
// lists are left out. Kernels older than 3.14 have no MemAvailable; there it is
// approximated by MemFree + Buffers + Cached.
func (g *ProcGauge) Host() (HostMemory, error) {
	mi, err := g.meminfo("host")
	if err != nil {
		return HostMemory{}, err
	}
	total, err := g.meminfoField("host", mi, "MemTotal")
	if err != nil {
		return HostMemory{}, err
	}
	var avail int64
	if _, ok := mi["MemAvailable"]; ok {
		if avail, err = g.meminfoField("host", mi, "MemAvailable"); err != nil {
			return HostMemory{}, err
		}
	} else {
		for _, k := range []string{"MemFree", "Buffers", "Cached"} {
			v, err := g.meminfoField("host", mi, k)
			if err != nil {
				return HostMemory{}, err
			}
			avail += v
		}
	}
	if b, err := fs.ReadFile(g.fsys, "zoneinfo"); err == nil {
		if pages, ok := parseZoneinfoPCP(b); ok && pages <= (math.MaxInt64-avail)/g.pageSize {
			avail += pages * g.pageSize
		}
	}
	avail = min(avail, total)
	return HostMemory{TotalBytes: total, UsedBytes: total - avail, AvailableBytes: avail}, nil
}

// Process returns the resident set size of pid: Rss from /proc/PID/smaps_rollup, or
// resident pages × page size from /proc/PID/statm when smaps_rollup is unreadable
// (kernels before 4.14, or no ptrace access to the process). A process that no longer
// exists gives an error wrapping ErrProcessNotFound.
func (g *ProcGauge) Process(pid int) (int64, error) {
	if pid <= 0 {
		return 0, &GaugeError{Op: "process", Source: g.name(strconv.Itoa(pid)), Err: fmt.Errorf("invalid pid %d", pid)}
	}
	dir := strconv.Itoa(pid)
	rollup := path.Join(dir, "smaps_rollup")
	if b, err := fs.ReadFile(g.fsys, rollup); err == nil {
		// A zombie's or kernel thread's smaps_rollup is empty: fall through to statm.
		if rss, ok, perr := parseSmapsRss(b); perr != nil {
			return 0, &GaugeError{Op: "process", Source: g.name(rollup), Err: perr}
		} else if ok {
			return rss, nil
		}
	}
	statm := path.Join(dir, "statm")
	b, err := fs.ReadFile(g.fsys, statm)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("pid %d: %w", pid, ErrProcessNotFound)
		}
		return 0, &GaugeError{Op: "process", Source: g.name(statm), Err: err}
	}
	pages, err := parseStatmResident(b)
	if err != nil {
		return 0, &GaugeError{Op: "process", Source: g.name(statm), Err: err}
	}
	if pages > math.MaxInt64/g.pageSize {
		return 0, &GaugeError{Op: "process", Source: g.name(statm), Err: fmt.Errorf("%w: %d resident pages overflow", ErrMalformed, pages)}
	}
	return pages * g.pageSize, nil
}

func (g *ProcGauge) name(p string) string { return path.Join(g.root, p) }

// meminfo reads /proc/meminfo into key → raw value ("16384 kB").
func (g *ProcGauge) meminfo(op string) (map[string]string, error) {
	b, err := fs.ReadFile(g.fsys, "meminfo")
	if err != nil {
		return nil, &GaugeError{Op: op, Source: g.name("meminfo"), Err: err}
	}
	return parseColonFile(b), nil
}

func (g *ProcGauge) meminfoField(op string, mi map[string]string, key string) (int64, error) {
	raw, ok := mi[key]
	if !ok {
		return 0, &GaugeError{Op: op, Source: g.name("meminfo"), Err: fmt.Errorf("%w: no %s", ErrMalformed, key)}
	}
	v, err := parseSize(raw)
	if err != nil {
		return 0, &GaugeError{Op: op, Source: g.name("meminfo"), Err: fmt.Errorf("%s: %w", key, err)}
	}
	return v, nil
}

// parseColonFile parses "Key: value" lines (meminfo, one cpuinfo block, smaps_rollup).
// Lines without a colon are skipped; the first occurrence of a key wins.
func parseColonFile(b []byte) map[string]string {
	m := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if _, seen := m[k]; !seen {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// parseSize parses a meminfo-style size: "N kB" (kibibytes, whatever the kernel's
// spelling says) or a bare "N".
func parseSize(raw string) (int64, error) {
	fields := strings.Fields(raw)
	if len(fields) == 0 || len(fields) > 2 {
		return 0, fmt.Errorf("%w: size %q", ErrMalformed, raw)
	}
	n, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: size %q", ErrMalformed, raw)
	}
	if len(fields) == 1 {
		return n, nil
	}
	if fields[1] != "kB" {
		return 0, fmt.Errorf("%w: unit %q in %q", ErrMalformed, fields[1], raw)
	}
	if n > math.MaxInt64/1024 {
		return 0, fmt.Errorf("%w: size %q overflows", ErrMalformed, raw)
	}
	return n * 1024, nil
}

// parseZoneinfoPCP sums the "count:" lines of zoneinfo: the pages on the per-CPU free
// lists of every zone. ok is false when there is none or one does not parse.
func parseZoneinfoPCP(b []byte) (pages int64, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		v, found := strings.CutPrefix(strings.TrimSpace(sc.Text()), "count:")
		if !found {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 || pages > math.MaxInt64-n {
			return 0, false
		}
		pages += n
		ok = true
	}
	return pages, ok && sc.Err() == nil
}

// parseSmapsRss returns the Rss line of smaps_rollup; ok is false when there is none.
func parseSmapsRss(b []byte) (rss int64, ok bool, err error) {
	raw, ok := parseColonFile(b)["Rss"]
	if !ok {
		return 0, false, nil
	}
	rss, err = parseSize(raw)
	if err != nil {
		return 0, false, fmt.Errorf("Rss: %w", err)
	}
	return rss, true, nil
}

// parseStatmResident returns the second field of statm: resident pages.
func parseStatmResident(b []byte) (int64, error) {
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0, fmt.Errorf("%w: statm %q", ErrMalformed, strings.TrimSpace(string(b)))
	}
	n, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: statm resident %q", ErrMalformed, fields[1])
	}
	return n, nil
}

// parseCPUInfo returns the CPU model and the physical core count. Blocks are separated
// by blank lines, one per logical processor.
func parseCPUInfo(b []byte) (model string, cores int) {
	type core struct{ pkg, id string }
	physical := make(map[core]bool)
	logical := 0
	for _, block := range bytes.Split(b, []byte("\n\n")) {
		m := parseColonFile(block)
		if _, ok := m["processor"]; !ok {
			continue
		}
		logical++
		if model == "" {
			model = m["model name"]
		}
		if id, ok := m["core id"]; ok {
			physical[core{m["physical id"], id}] = true
		}
	}
	if model == "" {
		// arm64 kernels have no "model name"; some name the board in a trailing
		// "Hardware" line outside the processor blocks.
		model = parseColonFile(b)["Hardware"]
	}
	if len(physical) > 0 {
		return model, len(physical)
	}
	return model, logical
}
