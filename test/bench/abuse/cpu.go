package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Where the CPU went while the other client was measured beside an attack: the
// server under attack (the gateway or `macfleet serve`), this process (the attacker
// and the other client), and the whole machine. On a machine of few cores the
// attacker's own work competes with the server's: these say how much.

// clockTicks is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// cpuSample is a reading of CPU times, in seconds: the server's and this process's,
// and the machine's busy and total time summed over its cores.
type cpuSample struct {
	at                        time.Time
	server, self, busy, total float64
	err                       error
}

// cpuUse is what the CPU did between two samples: the server's and this process's
// use in cores (1.0 is one core all the time), and the machine's busy share of all
// its cores.
type cpuUse struct {
	Server, Self, MachineBusy float64
	Cores                     int
	Err                       string
}

// sampleCPU reads the CPU times of process pid, of this process and of the machine
// (Linux /proc; err says what could not be read).
func sampleCPU(pid int) cpuSample {
	s := cpuSample{at: time.Now()}
	var err error
	if s.server, err = processCPU(strconv.Itoa(pid)); err != nil {
		s.err = err
		return s
	}
	if s.self, err = processCPU("self"); err != nil {
		s.err = err
		return s
	}
	s.busy, s.total, s.err = machineCPU()
	return s
}

// since is the use from b to s.
func (s cpuSample) since(b cpuSample) cpuUse {
	switch {
	case b.err != nil:
		return cpuUse{Err: b.err.Error()}
	case s.err != nil:
		return cpuUse{Err: s.err.Error()}
	}
	wall := s.at.Sub(b.at).Seconds()
	if wall <= 0 || s.total <= b.total {
		return cpuUse{Err: "no time passed between the samples"}
	}
	// iowait may go backwards (the kernel counts it per runqueue), which can make the
	// busy time grow by more than the total: the share is kept within 0 and 1.
	u := cpuUse{Server: (s.server - b.server) / wall, Self: (s.self - b.self) / wall,
		MachineBusy: min(1, max(0, (s.busy-b.busy)/(s.total-b.total)))}
	u.Cores = int((s.total-b.total)/wall + 0.5)
	return u
}

// String is the use as the summary prints it.
func (u cpuUse) String() string {
	if u.Err != "" {
		return "CPU not read: " + u.Err
	}
	return fmt.Sprintf("CPU: the server %.2f cores, the attacker and client %.2f, the machine %.0f %% busy of %d cores",
		u.Server, u.Self, u.MachineBusy*100, u.Cores)
}

// processCPU is the user and system time of /proc/<pid>, in seconds.
func processCPU(pid string) (float64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 { // state is the 3rd field of the line, utime the 14th, stime the 15th
		return 0, fmt.Errorf("/proc/%s/stat: %d fields after the name", pid, len(f))
	}
	var ticks float64
	for _, v := range f[11:13] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%s/stat: %w", pid, err)
		}
		ticks += n
	}
	return ticks / clockTicks, nil
}

// machineCPU is the machine's busy and total time over all its cores, in seconds
// (/proc/stat's first line: idle and iowait are not busy).
func machineCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest and guest_nice are counted in user and nice already
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy / clockTicks, total / clockTicks, nil
}
