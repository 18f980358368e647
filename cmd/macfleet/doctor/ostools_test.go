package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

// vmStatOutput is vm_stat's output on a 16 GiB Apple Silicon Mac (macOS 14), with
// the counters of machstat's HostMemory test: app 400000 - 10000, wired 100000,
// compressor 50000 → 540000 pages used.
const vmStatOutput = `Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                3145.
Pages active:                            210000.
Pages inactive:                          205000.
Pages speculative:                         1500.
Pages throttled:                              0.
Pages wired down:                        100000.
Pages purgeable:                          10000.
"Translation faults":                 123456789.
Pages copy-on-write:                    4567890.
Pages zero filled:                     98765432.
Pages reactivated:                       123456.
Pages purged:                             45678.
File-backed pages:                       150000.
Anonymous pages:                         400000.
Pages stored in compressor:              120000.
Pages occupied by compressor:             50000.
Decompressions:                          234567.
Compressions:                            345678.
Pageins:                                 456789.
Pageouts:                                  1234.
Swapins:                                      0.
Swapouts:                                     0.
`

const memoryPressureOutput = `The system has 17179869184 (1048576 pages with a page size of 16384).

Stats:
Pages free: 3145
Pages purgeable: 10000
Pages purged: 45678

Swap I/O:
Swapins: 0
Swapouts: 0

Page Q counts:
Pages active: 210000
Pages inactive: 205000
Pages speculative: 1500
Pages throttled: 0
Pages wired down: 100000

Compressor Stats:
Pages used by compressor: 50000
Pages decompressed: 234567
Pages compressed: 345678

File I/O:
Pageins: 456789
Pageouts: 1234

System-wide memory free percentage: 62%
`

const meminfoOutput = `MemTotal:       16384000 kB
MemFree:         8000000 kB
MemAvailable:   12000000 kB
Buffers:          100000 kB
Cached:          3000000 kB
HugePages_Total:       0
`

func TestVMStatUsed(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr string
	}{
		{name: "activity monitor formula", in: vmStatOutput, want: 540000 * 16384},
		{name: "4 KiB pages", in: strings.Replace(vmStatOutput, "16384", "4096", 1), want: 540000 * 4096},
		{name: "purgeable above anonymous", in: strings.Replace(vmStatOutput, "Pages purgeable:                          10000.",
			"Pages purgeable:                         900000.", 1), want: 150000 * 16384},
		{name: "no header", in: "Pages free: 1.\n", wantErr: "no page size"},
		{name: "no counters", in: "Mach Virtual Memory Statistics: (page size of 4096 bytes)\n", wantErr: "no counters"},
		{name: "compressor missing", in: strings.Replace(vmStatOutput, "Pages occupied by compressor", "Occupied", 1),
			wantErr: `no "Pages occupied by compressor"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs, err := parseVMStat([]byte(tt.in))
			var got int64
			if err == nil {
				got, err = vs.usedBytes()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("used = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
	// The quoted label parses like the others.
	vs, _ := parseVMStat([]byte(vmStatOutput))
	if vs.pages["Translation faults"] != 123456789 {
		t.Errorf("Translation faults = %d", vs.pages["Translation faults"])
	}
}

func TestParsers(t *testing.T) {
	mi, err := meminfoBytes([]byte(meminfoOutput), "MemTotal", "MemAvailable")
	if err != nil || mi["MemTotal"] != 16384000<<10 || mi["MemAvailable"] != 12000000<<10 {
		t.Errorf("meminfoBytes = %v, %v", mi, err)
	}
	if _, err := meminfoBytes([]byte("MemTotal: 1 kB\n"), "MemTotal", "MemAvailable"); err == nil {
		t.Error("meminfoBytes without MemAvailable: no error")
	}
	if rss, err := procStatusRSS([]byte("Name:\tmacfleet-runner\nVmPeak:\t  900 kB\nVmRSS:\t   38528 kB\n")); err != nil || rss != 38528<<10 {
		t.Errorf("procStatusRSS = %d, %v", rss, err)
	}
	if pct, err := parseMemoryPressure([]byte(memoryPressureOutput)); err != nil || pct != 62 {
		t.Errorf("parseMemoryPressure = %d, %v", pct, err)
	}
	if _, err := parseMemoryPressure([]byte("usage: memory_pressure [-l level]\n")); err == nil {
		t.Error("parseMemoryPressure of a usage message: no error")
	}
	zone := "Node 0, zone   Normal\n  pagesets\n    cpu: 0\n              count: 120\n    cpu: 1\n              count: 30\n" +
		"Node 0, zone  DMA32\n    cpu: 0\n              count: bogus\n"
	if got := zoneinfoPCPPages([]byte(zone)); got != 150 {
		t.Errorf("zoneinfoPCPPages = %d, want 150", got)
	}
	for in, want := range map[string]int64{"17179869184\n": 17179869184, " 0\n": 0, "  38528\n": 38528} {
		if got, err := parseInt([]byte(in)); err != nil || got != want {
			t.Errorf("parseInt(%q) = %d, %v", in, got, err)
		}
	}
}

// fakeTools answers from canned files and command outputs; a missing one is
// fs.ErrNotExist, as for a command that is not installed.
type fakeTools struct {
	files    map[string]string
	commands map[string]string // "sysctl -n hw.memsize" → output
}

func (f fakeTools) ReadFile(name string) ([]byte, error) {
	if s, ok := f.files[name]; ok {
		return []byte(s), nil
	}
	return nil, fmt.Errorf("open %s: %w", name, fs.ErrNotExist)
}

func (f fakeTools) Output(_ context.Context, name string, args ...string) ([]byte, error) {
	line := strings.Join(append([]string{name}, args...), " ")
	if s, ok := f.commands[line]; ok {
		return []byte(s), nil
	}
	return nil, fmt.Errorf("%s: %w", line, errors.ErrUnsupported)
}

func TestSystemTools(t *testing.T) {
	out, err := SystemTools{}.Output(t.Context(), "sh", "-c", "echo 4096")
	if v, perr := parseInt(out); err != nil || perr != nil || v != 4096 {
		t.Errorf("Output = %q, %v", out, err)
	}
	_, err = SystemTools{}.Output(t.Context(), "sh", "-c", "echo 'unknown oid iogpu.wired_limit_mb' >&2; exit 1")
	if err == nil || !strings.Contains(err.Error(), "unknown oid iogpu.wired_limit_mb") {
		t.Errorf("a failing command's error does not carry its stderr: %v", err)
	}
	if _, err := (SystemTools{}).ReadFile(t.TempDir() + "/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: %v", err)
	}
}
