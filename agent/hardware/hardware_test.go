package hardware

import (
	"errors"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/metal/enginepool"
)

const gib = int64(1) << 30

func TestOverridesApply(t *testing.T) {
	// A 64 GiB Mac: Metal's working set is 48 GiB, the wired limit raised to 56 GiB.
	mac64 := enginepool.Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib, WiredLimitBytes: 56 * gib,
		Chip: "Apple M1 Max", CPUCores: 10, GPUCores: 32}
	tests := []struct {
		name string
		o    Overrides
		hw   enginepool.Hardware
		want enginepool.Hardware
	}{
		{name: "zero overrides change nothing", hw: mac64, want: mac64},
		{
			name: "smaller memory scales the working set and drops a larger wired limit",
			o:    Overrides{UnifiedMemoryBytes: 16 * gib},
			hw:   mac64,
			want: enginepool.Hardware{TotalBytes: 16 * gib, MetalWorkingSetBytes: 12 * gib, Chip: "Apple M1 Max", CPUCores: 10, GPUCores: 32},
		},
		{
			name: "explicit working set and wired limit win",
			o:    Overrides{UnifiedMemoryBytes: 16 * gib, MetalWorkingSetBytes: 11 * gib, WiredLimitBytes: 14 * gib},
			hw:   mac64,
			want: enginepool.Hardware{TotalBytes: 16 * gib, MetalWorkingSetBytes: 11 * gib, WiredLimitBytes: 14 * gib,
				Chip: "Apple M1 Max", CPUCores: 10, GPUCores: 32},
		},
		{
			name: "same memory keeps the detected working set",
			o:    Overrides{UnifiedMemoryBytes: 64 * gib, Chip: "Apple M3 Max"},
			hw:   mac64,
			want: enginepool.Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib, WiredLimitBytes: 56 * gib,
				Chip: "Apple M3 Max", CPUCores: 10, GPUCores: 32},
		},
		{
			name: "Linux has no working set to scale",
			o:    Overrides{UnifiedMemoryBytes: 32 * gib},
			hw:   enginepool.Hardware{TotalBytes: 24 * gib, CPUCores: 2},
			want: enginepool.Hardware{TotalBytes: 32 * gib, CPUCores: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.o.Apply(tt.hw)); diff != "" {
				t.Errorf("Apply (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOverridesValidate(t *testing.T) {
	tests := []struct {
		name  string
		o     Overrides
		valid bool
	}{
		{name: "zero", valid: true},
		{name: "a Mac", o: Overrides{Chip: "Apple M2", UnifiedMemoryBytes: 16 * gib, MetalWorkingSetBytes: 11 * gib}, valid: true},
		{name: "negative memory", o: Overrides{UnifiedMemoryBytes: -1}},
		{name: "negative CPU cores", o: Overrides{CPUCores: -4}},
		{name: "negative GPU cores", o: Overrides{GPUCores: -4}},
		{name: "working set above memory", o: Overrides{UnifiedMemoryBytes: 16 * gib, MetalWorkingSetBytes: 17 * gib}},
		{name: "wired limit above memory", o: Overrides{UnifiedMemoryBytes: 16 * gib, WiredLimitBytes: 17 * gib}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.o.Validate()
			if tt.valid != (err == nil) {
				t.Fatalf("Validate() = %v, want valid=%v", err, tt.valid)
			}
			if err != nil && !errors.Is(err, ErrInvalidOverride) {
				t.Errorf("error %v does not wrap ErrInvalidOverride", err)
			}
		})
	}
}

// fakeGauge reports fixed hardware.
type fakeGauge struct {
	enginepool.Gauge // nil: Host and Process are not called
	hw               enginepool.Hardware
}

func (g fakeGauge) Hardware() (enginepool.Hardware, error) { return g.hw, nil }

// TestOverrideGaugeFeedsTheCeiling proves the point of OverrideGauge: a pool built on
// it computes its ceiling from the simulated Mac, not the host.
func TestOverrideGaugeFeedsTheCeiling(t *testing.T) {
	host := fakeGauge{hw: enginepool.Hardware{TotalBytes: 24 * gib, CPUCores: 2}}
	g := OverrideGauge(host, Overrides{UnifiedMemoryBytes: 16 * gib})
	hw, err := g.Hardware()
	if err != nil {
		t.Fatal(err)
	}
	c := enginepool.ComputeCeiling(hw, 0, 0, 0, 0)
	if want := 16*gib - enginepool.DefaultReserve(16*gib); c.Bytes != want {
		t.Errorf("ceiling = %d, want %d (16 GiB minus the reserve)", c.Bytes, want)
	}
	if OverrideGauge(host, Overrides{}) != enginepool.Gauge(host) {
		t.Error("OverrideGauge with zero overrides wrapped the gauge")
	}
}

// TestDetectThisMachine reads the real kernel: on Linux and macOS it must find memory.
func TestDetectThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("no gauge on " + runtime.GOOS)
	}
	info, err := Detect(Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if info.UnifiedMemoryBytes <= 0 || info.CPUCores <= 0 || info.Arch != runtime.GOARCH || info.OS != runtime.GOOS {
		t.Errorf("Detect() = %+v: want memory, cores, %s/%s", info, runtime.GOOS, runtime.GOARCH)
	}
	if _, err := Detect(Overrides{CPUCores: -1}); !errors.Is(err, ErrInvalidOverride) {
		t.Errorf("Detect with a negative override: %v, want ErrInvalidOverride", err)
	}
}
