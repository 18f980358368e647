package enginepool

import (
	"fmt"

	"github.com/macfleet/macfleet/metal/enginepool/internal/machstat"
)

const (
	gib = int64(1) << 30
	mib = int64(1) << 20
)

// CeilingBound names what binds the pool ceiling, for messages and status.
type CeilingBound string

const (
	// BoundStatic is unified memory minus the reserve left to macOS and other apps.
	BoundStatic CeilingBound = "static"
	// BoundMetalWorkingSet is the Metal recommended max working set.
	BoundMetalWorkingSet CeilingBound = "metal-working-set"
	// BoundWiredLimit is iogpu.wired_limit_mb.
	BoundWiredLimit CeilingBound = "wired-limit"
	// BoundConfigured is a ceiling set by flag, config file or MacNode spec.
	BoundConfigured CeilingBound = "configured"
)

// Default watermarks as fractions of the ceiling.
const (
	DefaultSoftFraction = 0.90
	DefaultHardFraction = 0.95
)

// DefaultReserve is the memory left to the OS below the static ceiling: 4 GiB on
// machines with less than 24 GiB, 6 GiB otherwise.
func DefaultReserve(totalBytes int64) int64 {
	if totalBytes < 24*gib {
		return 4 * gib
	}
	return 6 * gib
}

// MetalWorkingSetEstimate is what Metal's recommended working set is on a Mac of
// totalBytes of unified memory, at the least, when it cannot be asked (and for
// planning which Mac a model fits).
func MetalWorkingSetEstimate(totalBytes int64) int64 {
	return int64(machstat.MetalWorkingSetEstimate(uint64(max(totalBytes, 0))))
}

// Ceiling is the pool's memory ceiling, what bounds it, and its watermarks.
type Ceiling struct {
	// Bytes = min(static, Metal cap, configured), over the bounds that are present.
	Bytes int64 `json:"bytes"`
	// Bound is the bound that won the min.
	Bound CeilingBound `json:"bound"`
	// SoftBytes and HardBytes are the watermarks.
	SoftBytes int64 `json:"softBytes"`
	HardBytes int64 `json:"hardBytes"`

	TotalBytes      int64        `json:"totalBytes"`
	ReserveBytes    int64        `json:"reserveBytes"`
	StaticBytes     int64        `json:"staticBytes"`
	MetalCapBytes   int64        `json:"metalCapBytes,omitempty"`
	MetalCapBound   CeilingBound `json:"metalCapBound,omitempty"`
	ConfiguredBytes int64        `json:"configuredBytes,omitempty"`
}

// ComputeCeiling derives the ceiling from the hardware, a configured ceiling (0 for
// none), a reserve (0 for DefaultReserve) and the watermark fractions (0 for the
// defaults). The Metal cap is the wired limit when set, else the recommended working
// set; on Linux both are absent. Ties go to the bound an operator can change most
// directly: configured, then the wired limit, then the working set, then static.
func ComputeCeiling(hw Hardware, configured, reserve int64, soft, hard float64) Ceiling {
	if reserve <= 0 {
		reserve = DefaultReserve(hw.TotalBytes)
	}
	if soft <= 0 || soft > 1 {
		soft = DefaultSoftFraction
	}
	if hard <= 0 || hard > 1 {
		hard = DefaultHardFraction
	}
	c := Ceiling{TotalBytes: hw.TotalBytes, ReserveBytes: reserve, ConfiguredBytes: max(configured, 0)}
	c.StaticBytes = max(hw.TotalBytes-reserve, 0)
	switch {
	case hw.WiredLimitBytes > 0:
		c.MetalCapBytes, c.MetalCapBound = hw.WiredLimitBytes, BoundWiredLimit
	case hw.MetalWorkingSetBytes > 0:
		c.MetalCapBytes, c.MetalCapBound = hw.MetalWorkingSetBytes, BoundMetalWorkingSet
	}
	c.Bytes, c.Bound = c.StaticBytes, BoundStatic
	if c.MetalCapBytes > 0 && c.MetalCapBytes <= c.Bytes {
		c.Bytes, c.Bound = c.MetalCapBytes, c.MetalCapBound
	}
	if c.ConfiguredBytes > 0 && c.ConfiguredBytes <= c.Bytes {
		c.Bytes, c.Bound = c.ConfiguredBytes, BoundConfigured
	}
	c.SoftBytes = int64(float64(c.Bytes) * soft)
	c.HardBytes = int64(float64(c.Bytes) * hard)
	return c
}

// Describe names the binding ceiling and where it comes from.
func (c Ceiling) Describe() string {
	switch c.Bound {
	case BoundConfigured:
		return fmt.Sprintf("bound by the configured ceiling of %s", formatBytes(c.ConfiguredBytes))
	case BoundWiredLimit:
		return fmt.Sprintf("bound by the GPU wired limit iogpu.wired_limit_mb = %d", c.MetalCapBytes/mib)
	case BoundMetalWorkingSet:
		return fmt.Sprintf("bound by the Metal recommended working set of %s", formatBytes(c.MetalCapBytes))
	default:
		return fmt.Sprintf("bound by the static ceiling: %s of memory minus a %s reserve",
			formatBytes(c.TotalBytes), formatBytes(c.ReserveBytes))
	}
}

// Fix says how to raise the binding ceiling.
func (c Ceiling) Fix() string {
	switch c.Bound {
	case BoundConfigured:
		return "raise the configured memory ceiling (agent --memory-ceiling or the MacNode spec.memoryCeiling)"
	case BoundWiredLimit:
		return "raise the wired limit (sudo sysctl iogpu.wired_limit_mb=N)"
	case BoundMetalWorkingSet:
		return "raise the GPU wired limit above the working set (sudo sysctl iogpu.wired_limit_mb=N)"
	default:
		return "lower the memory reserve (agent --memory-reserve) or use a Mac with more memory"
	}
}
