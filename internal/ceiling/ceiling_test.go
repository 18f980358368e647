package ceiling

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Bounds
		want Ceiling
	}{
		{name: "nothing set", in: Bounds{}, want: Ceiling{}},
		{name: "report alone", in: Bounds{Reported: 12 * gib}, want: Ceiling{12 * gib, SourceReported}},
		{name: "operator lowers the report", in: Bounds{Reported: 12 * gib, Operator: 8 * gib}, want: Ceiling{8 * gib, SourceOperator}},
		{name: "operator above the report", in: Bounds{Reported: 12 * gib, Operator: 20 * gib}, want: Ceiling{12 * gib, SourceReported}},
		{name: "chip caps a huge report", in: Bounds{Reported: 1024 * gib, Chip: 32 * gib}, want: Ceiling{32 * gib, SourceChip}},
		{name: "operator below chip", in: Bounds{Reported: 1024 * gib, Operator: 16 * gib, Chip: 32 * gib}, want: Ceiling{16 * gib, SourceOperator}},
		{name: "tie keeps the report", in: Bounds{Reported: 16 * gib, Operator: 16 * gib, Chip: 16 * gib}, want: Ceiling{16 * gib, SourceReported}},
		{name: "agent: flag alone", in: Bounds{Flag: 6 * gib}, want: Ceiling{6 * gib, SourceFlag}},
		{name: "agent: spec lowers flag", in: Bounds{Flag: 6 * gib, Operator: 4 * gib}, want: Ceiling{4 * gib, SourceOperator}},
		{name: "agent: flag lowers spec", in: Bounds{Flag: 3 * gib, Operator: 4 * gib}, want: Ceiling{3 * gib, SourceFlag}},
		{name: "measured memory caps a report under a bigger chip", in: Bounds{Reported: 100 * gib, Measured: 16 * gib, Chip: 128 * gib},
			want: Ceiling{16 * gib, SourceMeasured}},
		{name: "tie of measured and chip says measured", in: Bounds{Reported: 100 * gib, Measured: 32 * gib, Chip: 32 * gib},
			want: Ceiling{32 * gib, SourceMeasured}},
		{name: "negative bounds are unset", in: Bounds{Reported: -1, Operator: -5, Chip: 8 * gib}, want: Ceiling{8 * gib, SourceChip}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Resolve(tc.in)); diff != "" {
				t.Errorf("Resolve(%+v) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestAgent(t *testing.T) {
	for _, tc := range []struct{ flag, spec, want int64 }{
		{0, 0, 0}, {6, 0, 6}, {0, 4, 4}, {6, 4, 4}, {3, 4, 3},
	} {
		if got := Agent(tc.flag, tc.spec); got != tc.want {
			t.Errorf("Agent(%d, %d) = %d, want %d", tc.flag, tc.spec, got, tc.want)
		}
	}
}

func TestChipMemory(t *testing.T) {
	for _, tc := range []struct {
		chip      string
		wantGiB   int64
		wantKnown bool
	}{
		{"Apple M1", 16, true},
		{"Apple M1 Ultra", 128, true},
		{"Apple M2 Max", 96, true},
		{"Apple M2 Ultra (simulated)", 192, true},
		{"apple m3 ultra", 512, true},
		{"Apple M3 Pro", 36, true},
		{"Apple M4", 32, true},
		{"Apple M4 (simulated)", 32, true},
		{"Apple M4 Pro", 64, true},
		{"Apple M4 Max", 128, true},
		{"Apple M5", 32, true},
		// Not in the table: bounded by the largest Mac there is.
		{"Apple M4 Ultra", 512, false},
		{"Apple M9", 512, false},
		{"Intel(R) Xeon(R) CPU @ 2.20GHz", 512, false},
		{"", 512, false},
		{"M2 Max", 512, false},
	} {
		got, known := ChipMemory(tc.chip)
		if got != tc.wantGiB*gib || known != tc.wantKnown {
			t.Errorf("ChipMemory(%q) = %d GiB, %v; want %d GiB, %v", tc.chip, got/gib, known, tc.wantGiB, tc.wantKnown)
		}
	}
}

func TestNode(t *testing.T) {
	node := func(chip, reported, spec string) *v1alpha1.MacNode {
		mn := &v1alpha1.MacNode{}
		mn.Status.Hardware.Chip = chip
		if reported != "" {
			mn.Status.Memory.Ceiling = ptr.To(resource.MustParse(reported))
		}
		if spec != "" {
			mn.Spec.MemoryCeiling = ptr.To(resource.MustParse(spec))
		}
		return mn
	}
	for _, tc := range []struct {
		name   string
		node   *v1alpha1.MacNode
		want   Ceiling
		wantOK bool
	}{
		{name: "no report", node: node("Apple M4", "", "8Gi"), want: Ceiling{}, wantOK: false},
		{name: "honest M4", node: node("Apple M4", "28Gi", ""), want: Ceiling{28 * gib, SourceReported}, wantOK: true},
		{name: "M4 claiming a terabyte", node: node("Apple M4", "1Ti", ""), want: Ceiling{32 * gib, SourceChip}, wantOK: true},
		{name: "operator bound", node: node("Apple M3 Ultra", "1Ti", "100Gi"), want: Ceiling{100 * gib, SourceOperator}, wantOK: true},
		{name: "unknown chip", node: node("", "1Ti", ""), want: Ceiling{512 * gib, SourceChip}, wantOK: true},
		{name: "zero report", node: node("Apple M4", "0", "8Gi"), want: Ceiling{0, SourceReported}, wantOK: true},
		{name: "a bigger chip than the memory measured", node: measured(node("Apple M4 Max", "100Gi", ""), "16Gi", ""),
			want: Ceiling{16 * gib, SourceMeasured}, wantOK: true},
		{name: "more memory than first measured", node: measured(node("Apple M4 Max", "120Gi", ""), "128Gi", "16Gi"),
			want: Ceiling{16 * gib, SourceMeasured}, wantOK: true},
		{name: "honest, within what was measured", node: measured(node("Apple M4", "12Gi", ""), "16Gi", "16Gi"),
			want: Ceiling{12 * gib, SourceReported}, wantOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Node(tc.node)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); ok && diff != "" {
				t.Errorf("Node (-want +got):\n%s", diff)
			}
		})
	}
}

// measured sets mn's reported unified memory (hardware) and the one the controller
// kept (first); "" leaves either unset.
func measured(mn *v1alpha1.MacNode, hardware, first string) *v1alpha1.MacNode {
	if hardware != "" {
		mn.Status.Hardware.UnifiedMemory = ptr.To(resource.MustParse(hardware))
	}
	if first != "" {
		mn.Status.EffectiveCeiling = &v1alpha1.EffectiveCeiling{MeasuredMemory: ptr.To(resource.MustParse(first))}
	}
	return mn
}

func TestFirstMeasured(t *testing.T) {
	for _, tc := range []struct {
		name, hardware, first, want string
	}{
		{"none", "", "", ""},
		{"the report, first seen", "16Gi", "", "16Gi"},
		{"the one kept, whatever is reported now", "128Gi", "16Gi", "16Gi"},
	} {
		got := FirstMeasured(measured(&v1alpha1.MacNode{}, tc.hardware, tc.first))
		if s := ""; got != nil {
			s = got.String()
			if s != tc.want {
				t.Errorf("%s: FirstMeasured = %s, want %q", tc.name, s, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("%s: FirstMeasured = nil, want %s", tc.name, tc.want)
		}
	}
}
