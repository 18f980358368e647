package enginepool

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestComputeCeiling(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hw         Hardware
		configured int64
		reserve    int64
		want       Ceiling
	}{
		{name: "16 GiB Mac: 4 GiB reserve", hw: Hardware{TotalBytes: 16 * gib},
			want: Ceiling{Bytes: 12 * gib, Bound: BoundStatic, TotalBytes: 16 * gib, ReserveBytes: 4 * gib, StaticBytes: 12 * gib}},
		{name: "24 GiB Mac: 6 GiB reserve", hw: Hardware{TotalBytes: 24 * gib},
			want: Ceiling{Bytes: 18 * gib, Bound: BoundStatic, TotalBytes: 24 * gib, ReserveBytes: 6 * gib, StaticBytes: 18 * gib}},
		{name: "configured reserve", hw: Hardware{TotalBytes: 24 * gib}, reserve: 2 * gib,
			want: Ceiling{Bytes: 22 * gib, Bound: BoundStatic, TotalBytes: 24 * gib, ReserveBytes: 2 * gib, StaticBytes: 22 * gib}},
		{name: "working set binds", hw: Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib},
			want: Ceiling{Bytes: 48 * gib, Bound: BoundMetalWorkingSet, TotalBytes: 64 * gib, ReserveBytes: 6 * gib, StaticBytes: 58 * gib,
				MetalCapBytes: 48 * gib, MetalCapBound: BoundMetalWorkingSet}},
		{name: "wired limit replaces the working set", hw: Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib, WiredLimitBytes: 56 * gib},
			want: Ceiling{Bytes: 56 * gib, Bound: BoundWiredLimit, TotalBytes: 64 * gib, ReserveBytes: 6 * gib, StaticBytes: 58 * gib,
				MetalCapBytes: 56 * gib, MetalCapBound: BoundWiredLimit}},
		{name: "static below the wired limit", hw: Hardware{TotalBytes: 64 * gib, WiredLimitBytes: 62 * gib},
			want: Ceiling{Bytes: 58 * gib, Bound: BoundStatic, TotalBytes: 64 * gib, ReserveBytes: 6 * gib, StaticBytes: 58 * gib,
				MetalCapBytes: 62 * gib, MetalCapBound: BoundWiredLimit}},
		{name: "configured wins when lower (several agents on one Linux host)", hw: Hardware{TotalBytes: 24 * gib}, configured: 3 * gib,
			want: Ceiling{Bytes: 3 * gib, Bound: BoundConfigured, TotalBytes: 24 * gib, ReserveBytes: 6 * gib, StaticBytes: 18 * gib, ConfiguredBytes: 3 * gib}},
		{name: "configured above static does not raise it", hw: Hardware{TotalBytes: 24 * gib}, configured: 30 * gib,
			want: Ceiling{Bytes: 18 * gib, Bound: BoundStatic, TotalBytes: 24 * gib, ReserveBytes: 6 * gib, StaticBytes: 18 * gib, ConfiguredBytes: 30 * gib}},
		{name: "tie goes to configured", hw: Hardware{TotalBytes: 24 * gib, MetalWorkingSetBytes: 18 * gib}, configured: 18 * gib,
			want: Ceiling{Bytes: 18 * gib, Bound: BoundConfigured, TotalBytes: 24 * gib, ReserveBytes: 6 * gib, StaticBytes: 18 * gib,
				MetalCapBytes: 18 * gib, MetalCapBound: BoundMetalWorkingSet, ConfiguredBytes: 18 * gib}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ComputeCeiling(tc.hw, tc.configured, tc.reserve, 0, 0)
			tc.want.SoftBytes = int64(float64(tc.want.Bytes) * 0.90)
			tc.want.HardBytes = int64(float64(tc.want.Bytes) * 0.95)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}
