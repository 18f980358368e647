package main

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestCPUUseSince(t *testing.T) {
	t0 := time.Unix(1000, 0)
	before := cpuSample{at: t0, server: 10, self: 4, busy: 100, total: 400}
	for _, tc := range []struct {
		name        string
		before, now cpuSample
		want        cpuUse
	}{
		{name: "two seconds of a 4-core machine", before: before,
			now:  cpuSample{at: t0.Add(2 * time.Second), server: 11, self: 6.5, busy: 106, total: 408},
			want: cpuUse{Server: 0.5, Self: 1.25, MachineBusy: 0.75, Cores: 4}},
		{name: "iowait went backwards: busy grew more than the total", before: before,
			now:  cpuSample{at: t0.Add(time.Second), server: 10, self: 4, busy: 104, total: 403},
			want: cpuUse{MachineBusy: 1, Cores: 3}},
		{name: "no time passed", before: before, now: before, want: cpuUse{Err: "no time passed between the samples"}},
		{name: "the first sample failed", before: cpuSample{err: errors.New("no such process")}, now: before,
			want: cpuUse{Err: "no such process"}},
		{name: "the second sample failed", before: before, now: cpuSample{err: errors.New("gone")}, want: cpuUse{Err: "gone"}},
	} {
		if got := tc.now.since(tc.before); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestSampleCPU reads this process as the server: its CPU time grows while it spins.
func TestSampleCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc:", err)
	}
	b := sampleCPU(os.Getpid())
	// Spin until /proc counts 50 ms more of this process (a tick is 10 ms), 10 s at most.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if s, err := processCPU("self"); err != nil || s-b.self >= 0.05 {
			break
		}
	}
	u := sampleCPU(os.Getpid()).since(b)
	if u.Err != "" || u.Server <= 0 || u.Self <= 0 || u.MachineBusy <= 0 || u.MachineBusy > 1 || u.Cores < 1 {
		t.Errorf("%+v: want this process's spinning seen, the machine's busy share between 0 and 1", u)
	}
	if !strings.Contains(u.String(), "the server") {
		t.Errorf("%q", u.String())
	}
}
