package engine

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc (100 on every Linux build).
const clockTicks = 100

// cpuMeter measures the CPU that processes other than the benchmark's own (this
// process, the agent and its runners) used during a measurement, to tell a quiet
// machine from a busy one: every figure here is sensitive to it. Linux only (/proc).
type cpuMeter struct {
	agentPID   int
	start      time.Time
	busy0, own int64
	ok         bool
}

// startCPU starts measuring; agentPID is the `macfleet serve` process.
func startCPU(agentPID int) *cpuMeter {
	m := &cpuMeter{agentPID: agentPID, start: time.Now()}
	busy, err := busyTicks()
	if err != nil {
		return m
	}
	own, err := ownTicks(agentPID)
	if err != nil {
		return m
	}
	m.busy0, m.own, m.ok = busy, own, true
	return m
}

// others returns the CPUs (in cores, averaged over the measurement) used by other
// processes; ok is false where /proc is not available.
func (m *cpuMeter) others() (cores float64, ok bool) {
	if !m.ok {
		return 0, false
	}
	busy, err := busyTicks()
	if err != nil {
		return 0, false
	}
	own, err := ownTicks(m.agentPID)
	if err != nil {
		return 0, false
	}
	wall := time.Since(m.start).Seconds()
	return max(float64((busy-m.busy0)-(own-m.own))/clockTicks/wall, 0), true
}

// describe renders others for a log line.
func (m *cpuMeter) describe() string {
	c, ok := m.others()
	if !ok {
		return "other processes' CPU n/a"
	}
	return fmt.Sprintf("other processes used %.2f of %d CPUs", c, runtime.NumCPU())
}

// busyTicks is the machine's non-idle CPU time from the first line of /proc/stat.
func busyTicks() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	var busy int64
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		busy += n
	}
	return busy, nil
}

// ownTicks is the CPU time of this process (not of its children), the agent (with
// its reaped children, the runners that exited) and the agent's live children.
func ownTicks(agentPID int) (int64, error) {
	self, _, _, err := procTicks(os.Getpid())
	if err != nil {
		return 0, err
	}
	agent, agentChildren, _, err := procTicks(agentPID)
	if err != nil {
		return 0, err
	}
	total := self + agent + agentChildren
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == agentPID || pid == os.Getpid() {
			continue
		}
		t, _, ppid, err := procTicks(pid)
		if err == nil && ppid == agentPID {
			total += t
		}
	}
	return total, nil
}

// procTicks returns a process's own CPU time (utime+stime), that of its reaped
// children (cutime+cstime) and its parent's pid.
func procTicks(pid int) (own, children int64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	// After "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime ...
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, 0, err
	}
	var t [4]int64
	for k, v := range f[11:15] {
		if t[k], err = strconv.ParseInt(v, 10, 64); err != nil {
			return 0, 0, 0, err
		}
	}
	return t[0] + t[1], t[2] + t[3], ppid, nil
}
