package hardware

import (
	"errors"
	"runtime"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// cpuinfo of a two-core x86 VM with hyper-threading: four logical processors on two
// physical cores.
const cpuinfoX86 = `processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) CPU @ 2.20GHz
physical id	: 0
core id		: 0

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) CPU @ 2.20GHz
physical id	: 0
core id		: 0

processor	: 2
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) CPU @ 2.20GHz
physical id	: 0
core id		: 1

processor	: 3
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) CPU @ 2.20GHz
physical id	: 0
core id		: 1
`

// cpuinfo of an arm64 board: no model name or core ids, a trailing Hardware line.
const cpuinfoARM = `processor	: 0
BogoMIPS	: 48.00
CPU implementer	: 0x41

processor	: 1
BogoMIPS	: 48.00
CPU implementer	: 0x41

processor	: 2
BogoMIPS	: 48.00
CPU implementer	: 0x41

Hardware	: Raspberry Pi 4 Model B
`

func meminfo(kB string) string {
	return "MemTotal:       " + kB + " kB\nMemFree:         1000000 kB\nMemAvailable:    2000000 kB\n"
}

func TestDetectFromProc(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		o       Overrides
		want    Info
		wantErr bool
	}{
		{
			name:  "x86 VM counts physical cores",
			files: map[string]string{"meminfo": meminfo("24583016"), "cpuinfo": cpuinfoX86},
			want: Info{Chip: "Intel(R) Xeon(R) CPU @ 2.20GHz", CPUCores: 2, UnifiedMemoryBytes: 24583016 * 1024,
				Arch: "amd64", OS: "linux"},
		},
		{
			name:  "arm64 board names the hardware",
			files: map[string]string{"meminfo": meminfo("3884376"), "cpuinfo": cpuinfoARM},
			want:  Info{Chip: "Raspberry Pi 4 Model B", CPUCores: 3, UnifiedMemoryBytes: 3884376 * 1024, Arch: "amd64", OS: "linux"},
		},
		{
			name:  "unreadable cpuinfo leaves chip and cores empty",
			files: map[string]string{"meminfo": meminfo("1048576")},
			want:  Info{UnifiedMemoryBytes: gib, Arch: "amd64", OS: "linux"},
		},
		{
			name:  "overrides simulate a Mac",
			files: map[string]string{"meminfo": meminfo("24583016"), "cpuinfo": cpuinfoX86},
			o: Overrides{Chip: "Apple M2 Max", UnifiedMemoryBytes: 32 * gib, CPUCores: 12, GPUCores: 38,
				MetalWorkingSetBytes: 21 * gib},
			want: Info{Chip: "Apple M2 Max", CPUCores: 12, GPUCores: 38, UnifiedMemoryBytes: 32 * gib,
				MetalWorkingSetBytes: 21 * gib, Arch: "amd64", OS: "linux"},
		},
		{
			name:  "a partial override keeps the rest",
			files: map[string]string{"meminfo": meminfo("24583016"), "cpuinfo": cpuinfoX86},
			o:     Overrides{UnifiedMemoryBytes: 16 * gib},
			want: Info{Chip: "Intel(R) Xeon(R) CPU @ 2.20GHz", CPUCores: 2, UnifiedMemoryBytes: 16 * gib,
				Arch: "amd64", OS: "linux"},
		},
		{
			name:    "no meminfo is an error",
			files:   map[string]string{"cpuinfo": cpuinfoX86},
			wantErr: true,
		},
		{
			name:    "malformed MemTotal is an error",
			files:   map[string]string{"meminfo": "MemTotal: lots kB\n", "cpuinfo": cpuinfoX86},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, content := range tt.files {
				fsys[name] = &fstest.MapFile{Data: []byte(content)}
			}
			g := OverrideGauge(enginepool.NewProcGauge(fsys, "/proc", 4096), tt.o)
			got, err := detect(g, "amd64", "linux")
			if tt.wantErr {
				if err == nil {
					t.Fatalf("detect succeeded with %+v, want an error", got)
				}
				var ge *enginepool.GaugeError
				if !errors.As(err, &ge) {
					t.Errorf("error %v does not wrap a *enginepool.GaugeError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Info (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPerformanceCoresAreThePhysicalCores: on Linux the thread policy counts the
// physical cores /proc/cpuinfo lists, between 1 and the logical CPUs.
func TestPerformanceCoresAreThePhysicalCores(t *testing.T) {
	g, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	hw, err := g.Hardware()
	if err != nil {
		t.Fatal(err)
	}
	got := PerformanceCores()
	if hw.CPUCores > 0 && got != hw.CPUCores {
		t.Errorf("PerformanceCores = %d, want the gauge's %d physical cores", got, hw.CPUCores)
	}
	if got < 1 || got > runtime.NumCPU() {
		t.Errorf("PerformanceCores = %d, want between 1 and the %d logical CPUs", got, runtime.NumCPU())
	}
}
