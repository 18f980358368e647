// Package machstat holds the darwin kernel structures the metal gauge reads through
// purego, and the arithmetic on them. It has no build constraints so that the layouts
// and the arithmetic are tested on every platform; only metal/enginepool/gauge_darwin.go calls
// the kernel.
//
// Layouts are copied field for field from the macOS SDK headers named on each type.
// Every field is naturally aligned on the 64-bit targets we build for (darwin/arm64,
// darwin/amd64), so Go's layout equals C's; machstat_test.go pins every offset and the
// total size.
package machstat

import (
	"encoding/binary"
	"fmt"
)

// HostVMInfo64 is the HOST_VM_INFO64 flavor of host_statistics64 (<mach/host_info.h>).
const HostVMInfo64 = 4

// HostVMInfo64Count is HOST_VM_INFO64_COUNT: sizeof(vm_statistics64_data_t) in
// integer_t (4-byte) units, the in/out count argument of host_statistics64.
const HostVMInfo64Count = 152 / 4

// VMStatistics64 mirrors struct vm_statistics64 (<mach/vm_statistics.h>, 152 bytes,
// __attribute__((aligned(8)))). Page counts are in units of the kernel page size
// (host_page_size). natural_t is uint32.
type VMStatistics64 struct {
	FreeCount       uint32 // off   0; includes speculative pages
	ActiveCount     uint32 // off   4
	InactiveCount   uint32 // off   8
	WireCount       uint32 // off  12
	ZeroFillCount   uint64 // off  16
	Reactivations   uint64 // off  24
	Pageins         uint64 // off  32
	Pageouts        uint64 // off  40
	Faults          uint64 // off  48
	CowFaults       uint64 // off  56
	Lookups         uint64 // off  64
	Hits            uint64 // off  72
	Purges          uint64 // off  80
	PurgeableCount  uint32 // off  88
	SpeculativeCnt  uint32 // off  92; already counted in FreeCount
	Decompressions  uint64 // off  96
	Compressions    uint64 // off 104
	Swapins         uint64 // off 112
	Swapouts        uint64 // off 120
	CompressorPages uint32 // off 128; pages holding compressed data
	ThrottledCount  uint32 // off 132
	ExternalPages   uint32 // off 136; file-backed
	InternalPages   uint32 // off 140; anonymous
	// TotalUncompressedPagesInCompressor is at offset 144.
	TotalUncompressedPagesInCompressor uint64
}

// RusageInfoV4Flavor is RUSAGE_INFO_V4 (<sys/resource.h>), the flavor argument of
// proc_pid_rusage.
const RusageInfoV4Flavor = 4

// RusageInfoV4 mirrors struct rusage_info_v4 (<sys/resource.h>, 296 bytes): a 16-byte
// UUID followed by 35 uint64 fields.
type RusageInfoV4 struct {
	UUID                      [16]byte // off   0
	UserTime                  uint64   // off  16
	SystemTime                uint64   // off  24
	PkgIdleWkups              uint64   // off  32
	InterruptWkups            uint64   // off  40
	Pageins                   uint64   // off  48
	WiredSize                 uint64   // off  56
	ResidentSize              uint64   // off  64
	PhysFootprint             uint64   // off  72: what Activity Monitor shows as Memory
	ProcStartAbstime          uint64   // off  80
	ProcExitAbstime           uint64   // off  88
	ChildUserTime             uint64   // off  96
	ChildSystemTime           uint64   // off 104
	ChildPkgIdleWkups         uint64   // off 112
	ChildInterruptWkups       uint64   // off 120
	ChildPageins              uint64   // off 128
	ChildElapsedAbstime       uint64   // off 136
	DiskioBytesread           uint64   // off 144
	DiskioByteswritten        uint64   // off 152
	CPUTimeQosDefault         uint64   // off 160
	CPUTimeQosMaintenance     uint64   // off 168
	CPUTimeQosBackground      uint64   // off 176
	CPUTimeQosUtility         uint64   // off 184
	CPUTimeQosLegacy          uint64   // off 192
	CPUTimeQosUserInitiated   uint64   // off 200
	CPUTimeQosUserInteractive uint64   // off 208
	BilledSystemTime          uint64   // off 216
	ServicedSystemTime        uint64   // off 224
	LogicalWrites             uint64   // off 232
	LifetimeMaxPhysFootprint  uint64   // off 240
	Instructions              uint64   // off 248
	Cycles                    uint64   // off 256
	BilledEnergy              uint64   // off 264
	ServicedEnergy            uint64   // off 272
	IntervalMaxPhysFootprint  uint64   // off 280
	RunnableTime              uint64   // off 288
}

// HostMemory turns one host_statistics64 sample into used and available bytes.
//
// Used follows Activity Monitor's "Memory Used": app memory (anonymous pages that are
// not purgeable) + wired + compressor. Everything else — free pages, file-backed cache,
// purgeable and speculative pages — is memory macOS hands out without swapping, so
// available = total − used, the same meaning as Linux's MemAvailable. Used is clamped
// to [0, total] so a racy sample never yields a negative or impossible figure.
func HostMemory(totalBytes, pageSize uint64, vm VMStatistics64) (usedBytes, availableBytes uint64) {
	app := uint64(vm.InternalPages)
	if p := uint64(vm.PurgeableCount); p < app {
		app -= p
	} else {
		app = 0
	}
	if vm.InternalPages == 0 {
		// Kernels that do not split internal/external pages: count active pages as
		// app memory (it overstates by the active file cache, the safe direction).
		app = uint64(vm.ActiveCount)
	}
	used := (app + uint64(vm.WireCount) + uint64(vm.CompressorPages)) * pageSize
	if used > totalBytes {
		used = totalBytes
	}
	return used, totalBytes - used
}

const gib = 1 << 30

// MetalWorkingSetEstimate approximates MTLDevice.recommendedMaxWorkingSetSize for an
// Apple Silicon Mac with totalBytes of unified memory, for when the Metal device
// cannot be queried (no window server, sandbox). Apple does not document a formula.
// The values Metal reported on shipping machines through macOS 15 are two thirds of
// RAM up to 36 GiB (8 → 5.33, 16 → 10.67, 32 → 21.33, 36 → 24 GiB) and three quarters
// above it (48 → 36, 64 → 48, 128 → 96 GiB); later releases were seen reporting more
// on large machines (≈107.5 GiB on 128 GiB). The estimate therefore is a lower bound:
// used as a cap it errs on the safe side. iogpu.wired_limit_mb, when set, overrides
// both and is read separately.
func MetalWorkingSetEstimate(totalBytes uint64) uint64 {
	if totalBytes <= 36*gib {
		return totalBytes * 2 / 3
	}
	return totalBytes * 3 / 4
}

// DecodeSysctlUint decodes a numeric sysctl value as returned raw by sysctlbyname:
// 4 bytes (CTLTYPE_INT) or 8 bytes (CTLTYPE_QUAD), little-endian on every Mac.
func DecodeSysctlUint(b []byte) (uint64, error) {
	switch len(b) {
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), nil
	case 8:
		return binary.LittleEndian.Uint64(b), nil
	default:
		return 0, fmt.Errorf("sysctl value of %d bytes is not a 32- or 64-bit integer", len(b))
	}
}
