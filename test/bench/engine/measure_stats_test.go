package engine

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestMedianAndPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 … 1, unsorted
	}
	for _, tc := range []struct {
		name        string
		in          []time.Duration
		median, p99 time.Duration
	}{
		{"empty", nil, 0, 0},
		{"one", ms(7), 7 * time.Millisecond, 7 * time.Millisecond},
		{"odd", ms(3, 1, 2), 2 * time.Millisecond, 3 * time.Millisecond},
		{"even", ms(4, 1, 3, 2), 2500 * time.Microsecond, 4 * time.Millisecond},
		{"hundred", ms(hundred...), 50500 * time.Microsecond, 99 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := median(tc.in); got != tc.median {
				t.Errorf("median = %v, want %v", got, tc.median)
			}
			if got := percentile(tc.in, 99); got != tc.p99 {
				t.Errorf("p99 = %v, want %v", got, tc.p99)
			}
		})
	}
}

func TestSumWords(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 64, 1001} {
		s := make([]uint64, n)
		var want uint64
		for i := range s {
			s[i] = uint64(i*i + 1)
			want += s[i]
		}
		if got := sumWords(s); got != want {
			t.Errorf("sumWords(%d words) = %d, want %d", n, got, want)
		}
	}
}

// TestCPUMeterSeesOtherProcesses checks that a process outside the benchmark's own
// (a shell spinning, child of this test) shows up as other processes' CPU.
func TestCPUMeterSeesOtherProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	// The "agent" is an idle process of our own. (The parent `go test` would not do:
	// when another package's test binary exits in the window, everything it and its
	// children ever used lands in the parent's reaped-children time at once.)
	agent := exec.Command("sleep", "60")
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	m := startCPU(agent.Process.Pid)
	if _, ok := m.others(); !ok {
		t.Fatal("the meter could not read /proc")
	}
	spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the measurement window
	spin.Process.Kill()
	_ = spin.Wait()
	if c, ok := m.others(); !ok || c < 0.2 {
		t.Errorf("others() = %.2f, %v while a shell spun for a second; want at least 0.2 CPUs", c, ok)
	}
}
