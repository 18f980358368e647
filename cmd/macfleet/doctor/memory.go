package doctor

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// osToolTimeout bounds each OS tool doctor runs (vm_stat, sysctl, memory_pressure, ps).
const osToolTimeout = 10 * time.Second

// gaugeMemory is one reading of the agent's gauge.
type gaugeMemory struct {
	hw      enginepool.Hardware
	hwErr   error
	host    enginepool.HostMemory
	hostErr error
}

func (m gaugeMemory) total() figure     { return figure{m.hw.TotalBytes, m.hwErr} }
func (m gaugeMemory) used() figure      { return figure{m.host.UsedBytes, m.hostErr} }
func (m gaugeMemory) available() figure { return figure{m.host.AvailableBytes, m.hostErr} }

// memoryRows sets the gauge's host figures beside the OS tools' of goos.
func memoryRows(ctx context.Context, goos string, m gaugeMemory, t Tools) []Row {
	switch goos {
	case "linux":
		return linuxRows(m, t)
	case "darwin":
		return darwinRows(ctx, m, t)
	}
	return []Row{{What: "memory", Agent: "-", OS: "-", Check: CheckUnavailable,
		Note: "no OS tools to compare with on " + goos}}
}

// linuxRows compares with /proc/meminfo, the source of free(1). The gauge counts the
// pages on the per-CPU free lists (/proc/zoneinfo) as available and MemAvailable does
// not, so the host figures may differ by what those lists hold at the moment: it is
// shown and added to the tolerance.
func linuxRows(m gaugeMemory, t Tools) []Row {
	var total, avail figure
	b, err := t.ReadFile("/proc/meminfo")
	var mi map[string]int64
	if err == nil {
		mi, err = meminfoBytes(b, "MemTotal", "MemAvailable")
	}
	if err != nil {
		total.err, avail.err = err, err
	} else {
		total.bytes, avail.bytes = mi["MemTotal"], mi["MemAvailable"]
	}
	used := figure{total.bytes - avail.bytes, total.err}
	tol, note := hostTolerance(m.hw.TotalBytes), "the gauge also counts the per-CPU free lists as available"
	if b, err := t.ReadFile("/proc/zoneinfo"); err == nil {
		pcp := zoneinfoPCPPages(b) * int64(os.Getpagesize())
		tol += pcp
		note = fmt.Sprintf("the gauge also counts the per-CPU free lists (/proc/zoneinfo: %s now) as available", formatSize(pcp))
	}
	return []Row{
		compare("memory total", m.total(), total, "/proc/meminfo MemTotal", exact, ""),
		compare("memory used", m.used(), used, "/proc/meminfo MemTotal - MemAvailable", tol, note),
		compare("memory available", m.available(), avail, "/proc/meminfo MemAvailable", tol, note),
	}
}

// darwinRows compares with sysctl, vm_stat and memory_pressure.
func darwinRows(ctx context.Context, m gaugeMemory, t Tools) []Row {
	run := func(name string, args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, osToolTimeout)
		defer cancel()
		return t.Output(ctx, name, args...)
	}
	sysctl := func(name string, unit int64) figure {
		b, err := run("sysctl", "-n", name)
		if err != nil {
			return figure{err: err}
		}
		v, err := parseInt(b)
		return figure{v * unit, err}
	}

	var used figure
	if b, err := run("vm_stat"); err != nil {
		used.err = err
	} else if vs, err := parseVMStat(b); err != nil {
		used.err = err
	} else {
		used.bytes, used.err = vs.usedBytes()
	}
	avail := figure{m.hw.TotalBytes - used.bytes, used.err}
	tol := hostTolerance(m.hw.TotalBytes)

	rows := []Row{
		compare("memory total", m.total(), sysctl("hw.memsize", 1), "sysctl hw.memsize", exact, ""),
		compare("wired limit", figure{m.hw.WiredLimitBytes, m.hwErr}, sysctl("iogpu.wired_limit_mb", 1<<20),
			"sysctl iogpu.wired_limit_mb", exact, "0 is the macOS default"),
		{What: "metal working set", Agent: formatSize(m.hw.MetalWorkingSetBytes), AgentBytes: m.hw.MetalWorkingSetBytes,
			OS: "-", OSSource: "(no OS tool)", Check: CheckInfo,
			Note: "MTLDevice.recommendedMaxWorkingSetSize, or an estimate when Metal cannot be asked"},
		compare("memory used", m.used(), used, "vm_stat anonymous - purgeable + wired + compressor", tol, ""),
		compare("memory available", m.available(), avail, "hw.memsize - vm_stat used", tol, ""),
	}
	free := Row{What: "memory free %", OSSource: "memory_pressure", Check: CheckInfo,
		Note: "memory_pressure counts free memory its own way; for reference"}
	if m.hostErr != nil || m.host.TotalBytes <= 0 {
		free.Agent = "-"
	} else {
		free.Agent = strconv.FormatInt(100*m.host.AvailableBytes/m.host.TotalBytes, 10) + "%"
	}
	if b, err := run("memory_pressure"); err != nil {
		free.OS, free.Check, free.Note = "error", CheckUnavailable, err.Error()
	} else if pct, err := parseMemoryPressure(b); err != nil {
		free.OS, free.Check, free.Note = "error", CheckUnavailable, err.Error()
	} else {
		free.OS = fmt.Sprintf("%d%%", pct)
	}
	return append(rows, free)
}

// processRow sets the gauge's footprint of pid beside the OS's resident size: on
// Linux /proc/PID/status VmRSS (the gauge reads smaps_rollup Rss, the same pages); on
// macOS ps's RSS, for reference only, since phys_footprint also counts Metal buffers
// and compressed memory.
func processRow(ctx context.Context, goos string, g enginepool.Gauge, t Tools, pid int) Row {
	fp, err := g.Process(pid)
	agent := figure{fp, err}
	what := fmt.Sprintf("runner footprint (pid %d)", pid)
	switch goos {
	case "linux":
		src := fmt.Sprintf("/proc/%d/status VmRSS", pid)
		var ref figure
		if b, err := t.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err != nil {
			ref.err = err
		} else {
			ref.bytes, ref.err = procStatusRSS(b)
		}
		return compare(what, agent, ref, src, processTolerance(fp), "")
	case "darwin":
		ctx, cancel := context.WithTimeout(ctx, osToolTimeout)
		defer cancel()
		var ref figure
		if b, err := t.Output(ctx, "ps", "-o", "rss=", "-p", strconv.Itoa(pid)); err != nil {
			ref.err = err
		} else {
			ref.bytes, ref.err = parseInt(b)
			ref.bytes <<= 10 // ps reports KiB
		}
		return compare(what, agent, ref, "ps -o rss", noCheck, "phys_footprint also counts Metal buffers and compressed memory")
	}
	return compare(what, agent, figure{err: fmt.Errorf("no OS tool on %s", goos)}, "-", noCheck, "")
}
