package machstat

import (
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

// The offsets below are the C offsets of the SDK structs (see the comments on the
// types); a mismatch would make the gauge read the wrong counters on a Mac.
func TestVMStatistics64Layout(t *testing.T) {
	var v VMStatistics64
	got := map[string]uintptr{
		"free_count":                             unsafe.Offsetof(v.FreeCount),
		"active_count":                           unsafe.Offsetof(v.ActiveCount),
		"inactive_count":                         unsafe.Offsetof(v.InactiveCount),
		"wire_count":                             unsafe.Offsetof(v.WireCount),
		"zero_fill_count":                        unsafe.Offsetof(v.ZeroFillCount),
		"purges":                                 unsafe.Offsetof(v.Purges),
		"purgeable_count":                        unsafe.Offsetof(v.PurgeableCount),
		"speculative_count":                      unsafe.Offsetof(v.SpeculativeCnt),
		"decompressions":                         unsafe.Offsetof(v.Decompressions),
		"swapouts":                               unsafe.Offsetof(v.Swapouts),
		"compressor_page_count":                  unsafe.Offsetof(v.CompressorPages),
		"throttled_count":                        unsafe.Offsetof(v.ThrottledCount),
		"external_page_count":                    unsafe.Offsetof(v.ExternalPages),
		"internal_page_count":                    unsafe.Offsetof(v.InternalPages),
		"total_uncompressed_pages_in_compressor": unsafe.Offsetof(v.TotalUncompressedPagesInCompressor),
		"sizeof":                                 unsafe.Sizeof(v),
	}
	want := map[string]uintptr{
		"free_count": 0, "active_count": 4, "inactive_count": 8, "wire_count": 12,
		"zero_fill_count": 16, "purges": 80, "purgeable_count": 88, "speculative_count": 92,
		"decompressions": 96, "swapouts": 120, "compressor_page_count": 128,
		"throttled_count": 132, "external_page_count": 136, "internal_page_count": 140,
		"total_uncompressed_pages_in_compressor": 144, "sizeof": 152,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("vm_statistics64 layout (-C +Go):\n%s", d)
	}
	if HostVMInfo64Count*4 != unsafe.Sizeof(v) {
		t.Errorf("HOST_VM_INFO64_COUNT = %d, want sizeof/4 = %d", HostVMInfo64Count, unsafe.Sizeof(v)/4)
	}
}

func TestRusageInfoV4Layout(t *testing.T) {
	var r RusageInfoV4
	got := map[string]uintptr{
		"ri_user_time":                   unsafe.Offsetof(r.UserTime),
		"ri_resident_size":               unsafe.Offsetof(r.ResidentSize),
		"ri_phys_footprint":              unsafe.Offsetof(r.PhysFootprint),
		"ri_child_elapsed_abstime":       unsafe.Offsetof(r.ChildElapsedAbstime),
		"ri_diskio_bytesread":            unsafe.Offsetof(r.DiskioBytesread),
		"ri_cpu_time_qos_default":        unsafe.Offsetof(r.CPUTimeQosDefault),
		"ri_logical_writes":              unsafe.Offsetof(r.LogicalWrites),
		"ri_lifetime_max_phys_footprint": unsafe.Offsetof(r.LifetimeMaxPhysFootprint),
		"ri_interval_max_phys_footprint": unsafe.Offsetof(r.IntervalMaxPhysFootprint),
		"ri_runnable_time":               unsafe.Offsetof(r.RunnableTime),
		"sizeof":                         unsafe.Sizeof(r),
	}
	want := map[string]uintptr{
		"ri_user_time": 16, "ri_resident_size": 64, "ri_phys_footprint": 72,
		"ri_child_elapsed_abstime": 136, "ri_diskio_bytesread": 144,
		"ri_cpu_time_qos_default": 160, "ri_logical_writes": 232,
		"ri_lifetime_max_phys_footprint": 240, "ri_interval_max_phys_footprint": 280,
		"ri_runnable_time": 288, "sizeof": 296,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rusage_info_v4 layout (-C +Go):\n%s", d)
	}
}

func TestHostMemory(t *testing.T) {
	const page = 16384
	const total = 16 << 30 // 1,048,576 pages of 16 KiB
	tests := []struct {
		name          string
		vm            VMStatistics64
		wantUsed      uint64
		wantAvailable uint64
	}{{
		name: "activity monitor formula",
		// app = 400000 - 10000; + wired 100000 + compressed 50000 = 540000 pages.
		vm: VMStatistics64{
			FreeCount: 200000, ActiveCount: 300000, InactiveCount: 250000, WireCount: 100000,
			PurgeableCount: 10000, CompressorPages: 50000, InternalPages: 400000, ExternalPages: 150000,
		},
		wantUsed:      540000 * page,
		wantAvailable: total - 540000*page,
	}, {
		name:          "purgeable larger than internal never underflows",
		vm:            VMStatistics64{InternalPages: 10, PurgeableCount: 20, WireCount: 5},
		wantUsed:      5 * page,
		wantAvailable: total - 5*page,
	}, {
		name:          "no internal split falls back to active",
		vm:            VMStatistics64{ActiveCount: 1000, WireCount: 10, CompressorPages: 1},
		wantUsed:      1011 * page,
		wantAvailable: total - 1011*page,
	}, {
		name:          "racy sample above total is clamped",
		vm:            VMStatistics64{InternalPages: 2_000_000},
		wantUsed:      total,
		wantAvailable: 0,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			used, avail := HostMemory(total, page, tt.vm)
			if used != tt.wantUsed || avail != tt.wantAvailable {
				t.Errorf("HostMemory = used %d, available %d; want %d, %d", used, avail, tt.wantUsed, tt.wantAvailable)
			}
		})
	}
}

func TestMetalWorkingSetEstimate(t *testing.T) {
	const GiB = 1 << 30
	tests := []struct {
		ram, want uint64
	}{
		{8 * GiB, 5726623061}, // 5.33 GiB, rounded down like the figure Metal reports
		{16 * GiB, 11453246122},
		{32 * GiB, 22906492245},
		{36 * GiB, 24 * GiB},
		{48 * GiB, 36 * GiB},
		{64 * GiB, 48 * GiB},
		{128 * GiB, 96 * GiB},
		{192 * GiB, 144 * GiB},
	}
	for _, tt := range tests {
		if got := MetalWorkingSetEstimate(tt.ram); got != tt.want {
			t.Errorf("MetalWorkingSetEstimate(%d GiB) = %d, want %d", tt.ram/GiB, got, tt.want)
		}
	}
}

func TestDecodeSysctlUint(t *testing.T) {
	tests := []struct {
		in      []byte
		want    uint64
		wantErr bool
	}{
		{in: []byte{0x00, 0x40, 0, 0}, want: 16384},
		{in: []byte{0, 0, 0, 0, 4, 0, 0, 0}, want: 16 << 30},
		{in: []byte{1, 2}, wantErr: true},
		{in: nil, wantErr: true},
	}
	for _, tt := range tests {
		got, err := DecodeSysctlUint(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("DecodeSysctlUint(%v) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
