//go:build linux

package enginepool

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

const sampleMeminfo = `MemTotal:       24682416 kB
MemFree:        21150180 kB
MemAvailable:   23760260 kB
Buffers:          153560 kB
Cached:          2509092 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

// A two-core, one-socket x86 machine with hyper-threading: four logical processors.
const sampleCPUInfoX86 = `processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Processor
physical id	: 0
core id		: 0
cpu cores	: 2

processor	: 1
model name	: Intel(R) Xeon(R) Processor
physical id	: 0
core id		: 0

processor	: 2
model name	: Intel(R) Xeon(R) Processor
physical id	: 0
core id		: 1

processor	: 3
model name	: Intel(R) Xeon(R) Processor
physical id	: 0
core id		: 1
`

// arm64 kernels: no model name, no core ids, the board in a trailing Hardware line.
const sampleCPUInfoARM = `processor	: 0
BogoMIPS	: 48.00
CPU implementer	: 0x61

processor	: 1
BogoMIPS	: 48.00
CPU implementer	: 0x61

processor	: 2
BogoMIPS	: 48.00

Hardware	: Apple M1 (virtual)
`

const sampleSmapsRollup = `55fcdb4a0000-7fffcc15c000 ---p 00000000 00:00 0                          [rollup]
Rss:                1752 kB
Pss:                 288 kB
Shared_Clean:       1596 kB
`

// Two zones of a two-CPU machine (per-node stats cut short).
const sampleZoneinfo = `Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 218541
  pages free     3840
  pagesets
    cpu: 0
              count:    0
              high:     0
              batch:    1
  vm stats threshold: 4
    cpu: 1
              count:    3
              high:     0
              batch:    1
  node_unreclaimable:  0
  start_pfn:           1
Node 0, zone   Normal
  pages free     1834129
  pagesets
    cpu: 0
              count:    1000
              high:     58982
              batch:    63
              high_min: 9660
              high_max: 299008
  vm stats threshold: 40
    cpu: 1
              count:    250
              high:     1559
              batch:    63
  node_unreclaimable:  0
  start_pfn:           1048576
`

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestProcGaugeHardware(t *testing.T) {
	tests := []struct {
		name    string
		fs      fstest.MapFS
		want    Hardware
		wantErr error
	}{{
		name: "x86 with hyper-threading counts physical cores",
		fs:   fstest.MapFS{"meminfo": file(sampleMeminfo), "cpuinfo": file(sampleCPUInfoX86)},
		want: Hardware{TotalBytes: 24682416 * 1024, Chip: "Intel(R) Xeon(R) Processor", CPUCores: 2},
	}, {
		name: "arm64 counts processors and names the board",
		fs:   fstest.MapFS{"meminfo": file(sampleMeminfo), "cpuinfo": file(sampleCPUInfoARM)},
		want: Hardware{TotalBytes: 24682416 * 1024, Chip: "Apple M1 (virtual)", CPUCores: 3},
	}, {
		name: "unreadable cpuinfo leaves chip and cores unknown",
		fs:   fstest.MapFS{"meminfo": file(sampleMeminfo)},
		want: Hardware{TotalBytes: 24682416 * 1024},
	}, {
		name:    "no meminfo",
		fs:      fstest.MapFS{"cpuinfo": file(sampleCPUInfoX86)},
		wantErr: fs.ErrNotExist,
	}, {
		name:    "no MemTotal",
		fs:      fstest.MapFS{"meminfo": file("MemFree: 12 kB\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "MemTotal in an unknown unit",
		fs:      fstest.MapFS{"meminfo": file("MemTotal: 12 MB\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "MemTotal not a number",
		fs:      fstest.MapFS{"meminfo": file("MemTotal: lots kB\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "MemTotal overflows",
		fs:      fstest.MapFS{"meminfo": file("MemTotal: 9223372036854775807 kB\n")},
		wantErr: ErrMalformed,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewProcGauge(tt.fs, "/proc", 4096).Hardware()
			checkGaugeErr(t, err, tt.wantErr)
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Hardware (-want +got):\n%s", d)
			}
		})
	}
}

func TestProcGaugeHost(t *testing.T) {
	const GiB = 1 << 30
	tests := []struct {
		name     string
		meminfo  string
		zoneinfo string
		want     HostMemory
		wantErr  error
	}{{
		// Freed pages waiting on the per-CPU lists are available: 1000 + 3 + 250 pages.
		name:     "per-CPU free lists count as available",
		meminfo:  sampleMeminfo,
		zoneinfo: sampleZoneinfo,
		want: HostMemory{
			TotalBytes:     24682416 * 1024,
			UsedBytes:      (24682416-23760260)*1024 - 1253*4096,
			AvailableBytes: 23760260*1024 + 1253*4096,
		},
	}, {
		name:     "an unparsable zoneinfo is left out",
		meminfo:  sampleMeminfo,
		zoneinfo: "  pagesets\n    cpu: 0\n              count:    many\n",
		want: HostMemory{
			TotalBytes:     24682416 * 1024,
			UsedBytes:      (24682416 - 23760260) * 1024,
			AvailableBytes: 23760260 * 1024,
		},
	}, {
		name:    "used is total minus available",
		meminfo: sampleMeminfo,
		want: HostMemory{
			TotalBytes:     24682416 * 1024,
			UsedBytes:      (24682416 - 23760260) * 1024,
			AvailableBytes: 23760260 * 1024,
		},
	}, {
		name:    "old kernel without MemAvailable",
		meminfo: "MemTotal: 4194304 kB\nMemFree: 1048576 kB\nBuffers: 0 kB\nCached: 1048576 kB\n",
		want:    HostMemory{TotalBytes: 4 * GiB, UsedBytes: 2 * GiB, AvailableBytes: 2 * GiB},
	}, {
		name:    "available above total is clamped",
		meminfo: "MemTotal: 1024 kB\nMemAvailable: 2048 kB\n",
		want:    HostMemory{TotalBytes: 1 << 20, UsedBytes: 0, AvailableBytes: 1 << 20},
	}, {
		name:    "malformed MemAvailable",
		meminfo: "MemTotal: 1024 kB\nMemAvailable: -5 kB\n",
		wantErr: ErrMalformed,
	}, {
		name:    "old kernel missing Cached",
		meminfo: "MemTotal: 1024 kB\nMemFree: 10 kB\nBuffers: 0 kB\n",
		wantErr: ErrMalformed,
	}, {
		name:    "empty",
		meminfo: "",
		wantErr: ErrMalformed,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{"meminfo": file(tt.meminfo)}
			if tt.zoneinfo != "" {
				fsys["zoneinfo"] = file(tt.zoneinfo)
			}
			got, err := NewProcGauge(fsys, "/proc", 4096).Host()
			checkGaugeErr(t, err, tt.wantErr)
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Host (-want +got):\n%s", d)
			}
		})
	}
}

func TestProcGaugeProcess(t *testing.T) {
	tests := []struct {
		name    string
		pid     int
		fs      fstest.MapFS
		want    int64
		wantErr error
	}{{
		name: "smaps_rollup Rss",
		pid:  42,
		fs:   fstest.MapFS{"42/smaps_rollup": file(sampleSmapsRollup), "42/statm": file("765 421 393 5 0 123 0\n")},
		want: 1752 * 1024,
	}, {
		name: "statm when smaps_rollup is unreadable",
		pid:  42,
		fs: fstest.MapFS{
			"42/smaps_rollup": &fstest.MapFile{Mode: fs.ModeDir}, // reading a directory fails
			"42/statm":        file("765 421 393 5 0 123 0\n"),
		},
		want: 421 * 4096,
	}, {
		name: "statm when there is no smaps_rollup (kernel < 4.14)",
		pid:  42,
		fs:   fstest.MapFS{"42/statm": file("765 421 393 5 0 123 0\n")},
		want: 421 * 4096,
	}, {
		name: "empty smaps_rollup of a zombie falls back to statm",
		pid:  42,
		fs:   fstest.MapFS{"42/smaps_rollup": file(""), "42/statm": file("0 0 0 0 0 0 0\n")},
		want: 0,
	}, {
		name:    "malformed Rss is an error, not a silent fallback",
		pid:     42,
		fs:      fstest.MapFS{"42/smaps_rollup": file("Rss: many kB\n"), "42/statm": file("1 1 1 1 1 1 1\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "malformed statm",
		pid:     42,
		fs:      fstest.MapFS{"42/statm": file("765\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "statm resident overflows bytes",
		pid:     42,
		fs:      fstest.MapFS{"42/statm": file("1 9223372036854775807 0\n")},
		wantErr: ErrMalformed,
	}, {
		name:    "gone process",
		pid:     43,
		fs:      fstest.MapFS{"42/statm": file("765 421 393 5 0 123 0\n")},
		wantErr: ErrProcessNotFound,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewProcGauge(tt.fs, "/proc", 4096).Process(tt.pid)
			checkGaugeErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Errorf("Process(%d) = %d, want %d", tt.pid, got, tt.want)
			}
		})
	}
	if _, err := NewProcGauge(fstest.MapFS{}, "/proc", 4096).Process(0); err == nil {
		t.Error("Process(0) succeeded")
	}
}

func checkGaugeErr(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var ge *GaugeError
	if !errors.As(err, &ge) {
		t.Fatalf("error %v (%T) is not a *GaugeError", err, err)
	}
	if !errors.Is(err, want) {
		t.Fatalf("error %v does not wrap %v", err, want)
	}
	if !strings.HasPrefix(ge.Source, "/proc/") {
		t.Errorf("error source %q does not name the /proc file", ge.Source)
	}
}

// The real /proc of this machine, against numbers the kernel gives independently.
func TestSystemGaugeLinux(t *testing.T) {
	g, err := NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	hw, err := g.Hardware()
	if err != nil {
		t.Fatal(err)
	}
	host, err := g.Host()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hardware %+v, host %+v", hw, host)
	if hw.TotalBytes <= 0 || hw.TotalBytes != host.TotalBytes {
		t.Errorf("hardware total %d, host total %d: want equal and positive", hw.TotalBytes, host.TotalBytes)
	}
	if hw.CPUCores <= 0 {
		t.Errorf("CPUCores = %d", hw.CPUCores)
	}
	if host.UsedBytes <= 0 || host.AvailableBytes <= 0 || host.UsedBytes+host.AvailableBytes != host.TotalBytes {
		t.Errorf("host %+v: used and available must be positive and add up to total", host)
	}

	// Our own footprint grows by what we touch: map 64 MiB of fresh anonymous memory
	// (not the Go heap, which may reuse pages that are already resident) and fault it in.
	before, err := g.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size; i += os.Getpagesize() {
		mem[i] = 1 // one write per page faults it in
	}
	after, err := g.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// statm from the same kernel agrees to within what a few allocations change.
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	released, err := g.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("self rss %d before, %d with 64 MiB touched, %d after unmapping it", before, after, released)
	if after-before < size-(4<<20) {
		t.Errorf("rss grew by %d bytes after touching 64 MiB", after-before)
	}
	if after-released < size-(4<<20) {
		t.Errorf("rss fell by %d bytes after unmapping 64 MiB", after-released)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if statm := pages * int64(os.Getpagesize()); absDiff(statm, after) > 16<<20 {
		t.Errorf("smaps_rollup rss %d and statm rss %d disagree", after, statm)
	}

	// A reaped child is not found.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Process(cmd.Process.Pid); !errors.Is(err, ErrProcessNotFound) {
		t.Errorf("Process(reaped child) error = %v, want ErrProcessNotFound", err)
	}
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
