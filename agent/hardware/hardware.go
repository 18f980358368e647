// Package hardware says what Mac a node agent runs on: the chip, CPU and GPU cores,
// unified memory, the Metal recommended working set and iogpu.wired_limit_mb, plus the
// architecture and operating system, as its MacNode shows them.
//
// The figures come from the engine pool's memory gauge (enginepool.Gauge.Hardware): on
// macOS sysctls, the Metal device and the IORegistry; on Linux /proc/meminfo and
// /proc/cpuinfo. This package does not read the kernel a second time; it adds the
// architecture and OS and applies Overrides, so that several agents on one Linux host
// can each simulate a different Mac. Wrap the gauge the pool is built with in
// OverrideGauge so that the pool's memory ceiling follows the simulated Mac too:
//
//	g, _ := enginepool.NewGauge()
//	g = hardware.OverrideGauge(g, overrides)
//	pool, _ := enginepool.New(cfg, factory, g, clk, log)
//	info := hardware.FromMetal(pool.Hardware())
package hardware

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Info is the hardware of one node.
type Info struct {
	// Chip is the SoC or CPU name, e.g. "Apple M2 Max"; empty when unknown.
	Chip string `json:"chip,omitempty"`
	// CPUCores is the number of physical CPU cores (performance and efficiency).
	CPUCores int `json:"cpuCores,omitempty"`
	// PerformanceCores are what the thread policy counts (PerformanceCores); 0 when
	// not read.
	PerformanceCores int `json:"performanceCores,omitempty"`
	// GPUCores is the number of GPU cores; 0 when unknown (always on Linux).
	GPUCores int `json:"gpuCores,omitempty"`
	// UnifiedMemoryBytes is the physical memory.
	UnifiedMemoryBytes int64 `json:"unifiedMemoryBytes"`
	// MetalWorkingSetBytes is Metal's recommended maximum working set; 0 on Linux.
	MetalWorkingSetBytes int64 `json:"metalWorkingSetBytes,omitempty"`
	// WiredLimitBytes is iogpu.wired_limit_mb when set; 0 when it is the default.
	WiredLimitBytes int64 `json:"wiredLimitBytes,omitempty"`
	// Arch and OS are runtime.GOARCH and runtime.GOOS ("arm64", "darwin").
	Arch string `json:"arch"`
	OS   string `json:"os"`
	// Accelerators are the GPUs with memory of their own (internal/devicegauge);
	// none on a Mac, whose GPU computes in the unified memory.
	Accelerators []Accelerator `json:"accelerators,omitempty"`
}

// Accelerator is one GPU with memory of its own.
type Accelerator struct {
	Name        string `json:"name"`
	MemoryBytes int64  `json:"memoryBytes"`
}

// WithAccelerators adds the cards g reads to info; a machine without the driver's
// tool has none, and a failing tool is returned for the caller to report.
func WithAccelerators(ctx context.Context, info Info, g devicegauge.Gauge) (Info, error) {
	cards, err := g.Cards(ctx)
	if errors.Is(err, devicegauge.ErrNoTool) {
		return info, nil
	}
	for _, c := range cards {
		info.Accelerators = append(info.Accelerators, Accelerator{Name: c.Name, MemoryBytes: c.TotalBytes})
	}
	return info, err
}

// Overrides replace detected figures; zero fields keep what was detected. The agent
// fills them from flags so that one host can run agents that look like different Macs.
type Overrides struct {
	Chip                 string
	UnifiedMemoryBytes   int64
	CPUCores             int
	GPUCores             int
	MetalWorkingSetBytes int64
	WiredLimitBytes      int64
}

// ErrInvalidOverride is wrapped by Overrides.Validate.
var ErrInvalidOverride = errors.New("invalid hardware override")

// Validate rejects negative figures and a working set or wired limit larger than the
// overridden unified memory.
func (o Overrides) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"unified memory", o.UnifiedMemoryBytes}, {"CPU cores", int64(o.CPUCores)}, {"GPU cores", int64(o.GPUCores)},
		{"Metal working set", o.MetalWorkingSetBytes}, {"wired limit", o.WiredLimitBytes},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %d", ErrInvalidOverride, f.name, f.v)
		}
	}
	if o.UnifiedMemoryBytes > 0 {
		if o.MetalWorkingSetBytes > o.UnifiedMemoryBytes {
			return fmt.Errorf("%w: the Metal working set (%d bytes) exceeds the unified memory (%d bytes)",
				ErrInvalidOverride, o.MetalWorkingSetBytes, o.UnifiedMemoryBytes)
		}
		if o.WiredLimitBytes > o.UnifiedMemoryBytes {
			return fmt.Errorf("%w: the wired limit (%d bytes) exceeds the unified memory (%d bytes)",
				ErrInvalidOverride, o.WiredLimitBytes, o.UnifiedMemoryBytes)
		}
	}
	return nil
}

// IsZero says whether o overrides nothing.
func (o Overrides) IsZero() bool { return o == Overrides{} }

// Apply returns hw with o's non-zero fields in place of the detected ones. When the
// unified memory is overridden and the Metal working set is not, a detected working set
// is scaled by the same ratio, so that a simulated 16 GiB Mac on a 64 GiB one does not
// keep the larger Mac's working set. A detected wired limit above the overridden memory
// is dropped (it would have no meaning there).
func (o Overrides) Apply(hw enginepool.Hardware) enginepool.Hardware {
	if o.Chip != "" {
		hw.Chip = o.Chip
	}
	if o.CPUCores > 0 {
		hw.CPUCores = o.CPUCores
	}
	if o.GPUCores > 0 {
		hw.GPUCores = o.GPUCores
	}
	if o.UnifiedMemoryBytes > 0 && o.UnifiedMemoryBytes != hw.TotalBytes {
		if o.MetalWorkingSetBytes == 0 && hw.MetalWorkingSetBytes > 0 && hw.TotalBytes > 0 {
			ratio := float64(hw.MetalWorkingSetBytes) / float64(hw.TotalBytes)
			hw.MetalWorkingSetBytes = int64(math.Round(ratio * float64(o.UnifiedMemoryBytes)))
		}
		if o.WiredLimitBytes == 0 && hw.WiredLimitBytes > o.UnifiedMemoryBytes {
			hw.WiredLimitBytes = 0
		}
		hw.TotalBytes = o.UnifiedMemoryBytes
	}
	if o.MetalWorkingSetBytes > 0 {
		hw.MetalWorkingSetBytes = o.MetalWorkingSetBytes
	}
	if o.WiredLimitBytes > 0 {
		hw.WiredLimitBytes = o.WiredLimitBytes
	}
	return hw
}

// FromMetal turns what the pool's gauge read into Info for this process's
// architecture and operating system.
func FromMetal(hw enginepool.Hardware) Info {
	return fromMetal(hw, runtime.GOARCH, runtime.GOOS)
}

func fromMetal(hw enginepool.Hardware, arch, goos string) Info {
	return Info{
		Chip: hw.Chip, CPUCores: hw.CPUCores, GPUCores: hw.GPUCores, UnifiedMemoryBytes: hw.TotalBytes,
		MetalWorkingSetBytes: hw.MetalWorkingSetBytes, WiredLimitBytes: hw.WiredLimitBytes, Arch: arch, OS: goos,
	}
}

// Detect reads this machine's hardware through enginepool.NewGauge and applies o. An agent
// that builds a pool should rather wrap the pool's gauge in OverrideGauge and call
// FromMetal(pool.Hardware()), which reads the hardware once for both.
func Detect(o Overrides) (Info, error) {
	if err := o.Validate(); err != nil {
		return Info{}, err
	}
	g, err := enginepool.NewGauge()
	if err != nil {
		return Info{}, fmt.Errorf("detecting the hardware: %w", err)
	}
	return detect(OverrideGauge(g, o), runtime.GOARCH, runtime.GOOS)
}

func detect(g enginepool.Gauge, arch, goos string) (Info, error) {
	hw, err := g.Hardware()
	if err != nil {
		return Info{}, fmt.Errorf("detecting the hardware: %w", err)
	}
	return fromMetal(hw, arch, goos), nil
}

// OverrideGauge returns g with o applied to every Hardware report; Host and Process
// measurements pass through. With a zero o it returns g itself.
func OverrideGauge(g enginepool.Gauge, o Overrides) enginepool.Gauge {
	if o.IsZero() {
		return g
	}
	return overrideGauge{Gauge: g, o: o}
}

type overrideGauge struct {
	enginepool.Gauge
	o Overrides
}

func (g overrideGauge) Hardware() (enginepool.Hardware, error) {
	hw, err := g.Gauge.Hardware()
	if err != nil {
		return hw, err
	}
	return g.o.Apply(hw), nil
}
