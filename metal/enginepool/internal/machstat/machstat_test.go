package machstat

import (
	"reflect"
	"testing"
)

// cField is one member of a C struct as an SDK header declares it: its name, and
// its offset and size on the 64-bit darwin targets (arm64, amd64).
type cField struct {
	name      string
	off, size uintptr
}

// checkLayout compares the Go mirror typ with the C struct, member by member in
// declaration order, and its total size: a member missing, added, moved or resized
// in the mirror would make the gauge read the wrong counters on a Mac.
func checkLayout(t *testing.T, typ reflect.Type, want []cField, sizeof uintptr) {
	t.Helper()
	if typ.NumField() != len(want) {
		t.Errorf("%s has %d fields, the C struct %d members", typ, typ.NumField(), len(want))
	}
	for i := range min(typ.NumField(), len(want)) {
		f, c := typ.Field(i), want[i]
		if f.Offset != c.off || f.Type.Size() != c.size {
			t.Errorf("%s.%s (C %s): offset %d size %d, want offset %d size %d",
				typ, f.Name, c.name, f.Offset, f.Type.Size(), c.off, c.size)
		}
	}
	if typ.Size() != sizeof {
		t.Errorf("sizeof %s = %d, want %d", typ, typ.Size(), sizeof)
	}
}

// TestVMStatistics64Layout pins VMStatistics64 to struct vm_statistics64 of the
// macOS SDK's <mach/vm_statistics.h>: natural_t members are 4 bytes, uint64_t 8, and
// the struct is __attribute__((aligned(8))), 152 bytes in all.
func TestVMStatistics64Layout(t *testing.T) {
	want := []cField{
		{"free_count", 0, 4}, {"active_count", 4, 4}, {"inactive_count", 8, 4}, {"wire_count", 12, 4},
		{"zero_fill_count", 16, 8}, {"reactivations", 24, 8}, {"pageins", 32, 8}, {"pageouts", 40, 8},
		{"faults", 48, 8}, {"cow_faults", 56, 8}, {"lookups", 64, 8}, {"hits", 72, 8}, {"purges", 80, 8},
		{"purgeable_count", 88, 4}, {"speculative_count", 92, 4},
		{"decompressions", 96, 8}, {"compressions", 104, 8}, {"swapins", 112, 8}, {"swapouts", 120, 8},
		{"compressor_page_count", 128, 4}, {"throttled_count", 132, 4},
		{"external_page_count", 136, 4}, {"internal_page_count", 140, 4},
		{"total_uncompressed_pages_in_compressor", 144, 8},
	}
	checkLayout(t, reflect.TypeFor[VMStatistics64](), want, 152)
	// HOST_VM_INFO64_COUNT (<mach/host_info.h>) is sizeof(vm_statistics64_data_t) / sizeof(integer_t).
	if HostVMInfo64Count != 152/4 {
		t.Errorf("HOST_VM_INFO64_COUNT = %d, want %d", HostVMInfo64Count, 152/4)
	}
}

// TestRusageInfoV4Layout pins RusageInfoV4 to struct rusage_info_v4 of the macOS
// SDK's <sys/resource.h>: uint8_t ri_uuid[16] followed by 35 uint64_t members, 296
// bytes in all. ri_phys_footprint at offset 72 is the figure the gauge reads.
func TestRusageInfoV4Layout(t *testing.T) {
	want := []cField{{"ri_uuid", 0, 16}}
	for i, name := range []string{
		"ri_user_time", "ri_system_time", "ri_pkg_idle_wkups", "ri_interrupt_wkups", "ri_pageins",
		"ri_wired_size", "ri_resident_size", "ri_phys_footprint", "ri_proc_start_abstime",
		"ri_proc_exit_abstime", "ri_child_user_time", "ri_child_system_time", "ri_child_pkg_idle_wkups",
		"ri_child_interrupt_wkups", "ri_child_pageins", "ri_child_elapsed_abstime", "ri_diskio_bytesread",
		"ri_diskio_byteswritten", "ri_cpu_time_qos_default", "ri_cpu_time_qos_maintenance",
		"ri_cpu_time_qos_background", "ri_cpu_time_qos_utility", "ri_cpu_time_qos_legacy",
		"ri_cpu_time_qos_user_initiated", "ri_cpu_time_qos_user_interactive", "ri_billed_system_time",
		"ri_serviced_system_time", "ri_logical_writes", "ri_lifetime_max_phys_footprint", "ri_instructions",
		"ri_cycles", "ri_billed_energy", "ri_serviced_energy", "ri_interval_max_phys_footprint",
		"ri_runnable_time",
	} {
		want = append(want, cField{name, 16 + 8*uintptr(i), 8})
	}
	checkLayout(t, reflect.TypeFor[RusageInfoV4](), want, 296)
	if want[8].name != "ri_phys_footprint" || want[8].off != 72 {
		t.Fatalf("the header table is off: %+v", want[8])
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
