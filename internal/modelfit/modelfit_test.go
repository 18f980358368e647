package modelfit

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

const gib = int64(1) << 30

func TestLadder(t *testing.T) {
	for _, tc := range []struct {
		trained int64
		want    []int64
	}{
		{0, []int64{4096, 8192, 16384, 32768}},
		{2048, []int64{2048}},
		{4096, []int64{4096}},
		{32768, []int64{4096, 8192, 16384, 32768}},
		{40960, []int64{4096, 8192, 16384, 32768, 40960}},
		{131072, []int64{4096, 8192, 16384, 32768, 65536, 131072}},
		{1 << 20, []int64{4096, 8192, 16384, 32768, 65536, 131072}},
	} {
		if diff := cmp.Diff(tc.want, Ladder(tc.trained)); diff != "" {
			t.Errorf("Ladder(%d) (-want +got):\n%s", tc.trained, diff)
		}
	}
}

func TestDecide(t *testing.T) {
	needs := []Need{{Context: 4096, Bytes: 5 * gib}, {Context: 32768, Bytes: 9 * gib}, {Context: 131072, Bytes: 20 * gib}}
	for _, tc := range []struct {
		name string
		mac  Mac
		want MacFit
	}{
		{"an empty Mac takes what is within its ceiling less its agent",
			Mac{Name: "m", Ceiling: 10 * gib, Agent: gib / 2},
			MacFit{Cells: []Cell{{4096, Fits, 9 * gib / 2}, {32768, Fits, gib / 2}, {131072, TooLarge, -21 * gib / 2}},
				MaxContext: 32768, MaxContextFreed: 32768}},
		{"committed memory leaves a smaller context now and the larger once freed",
			Mac{Name: "m", Ceiling: 10 * gib, Committed: 3 * gib},
			MacFit{Cells: []Cell{{4096, Fits, 2 * gib}, {32768, FitsWhenFreed, -2 * gib}, {131072, TooLarge, -13 * gib}},
				MaxContext: 4096, MaxContextFreed: 32768}},
		{"a Mac whose models leave too little takes nothing now",
			Mac{Name: "m", Ceiling: 24 * gib, Committed: 20 * gib},
			MacFit{Cells: []Cell{{4096, FitsWhenFreed, -1 * gib}, {32768, FitsWhenFreed, -5 * gib}, {131072, FitsWhenFreed, -16 * gib}},
				MaxContextFreed: 131072}},
		{"exactly the free memory fits",
			Mac{Name: "m", Ceiling: 9 * gib},
			MacFit{Cells: []Cell{{4096, Fits, 4 * gib}, {32768, Fits, 0}, {131072, TooLarge, -11 * gib}},
				MaxContext: 32768, MaxContextFreed: 32768}},
		{"no ceiling reported: nothing fits",
			Mac{Name: "m", Unavailable: "its agent has reported no memory ceiling"},
			MacFit{Cells: []Cell{{4096, TooLarge, -5 * gib}, {32768, TooLarge, -9 * gib}, {131072, TooLarge, -20 * gib}}}},
		{"more committed than the ceiling is no free memory, not negative",
			Mac{Name: "m", Ceiling: 8 * gib, Committed: 12 * gib},
			MacFit{Cells: []Cell{{4096, FitsWhenFreed, -5 * gib}, {32768, TooLarge, -9 * gib}, {131072, TooLarge, -20 * gib}},
				MaxContextFreed: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.Mac, tc.want.Free, tc.want.Capacity = tc.mac, tc.mac.Free(), tc.mac.Capacity()
			got := Decide([]Mac{tc.mac}, needs)
			if diff := cmp.Diff([]MacFit{tc.want}, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFromMacNode(t *testing.T) {
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.BinarySI) }
	ready := []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue}}
	now := metav1.NewTime(time.Unix(1e9, 0))
	node := func(mut func(*v1alpha1.MacNode)) *v1alpha1.MacNode {
		mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-1"},
			Status: v1alpha1.MacNodeStatus{Hardware: v1alpha1.HardwareStatus{Chip: "Apple M2 Pro", UnifiedMemory: q(32 * gib)},
				Memory:     v1alpha1.NodeMemoryStatus{Ceiling: q(26 * gib), Committed: q(6 * gib), Agent: q(gib / 4)},
				Conditions: ready}}
		mut(mn)
		return mn
	}
	for _, tc := range []struct {
		name string
		mn   *v1alpha1.MacNode
		want Mac
	}{
		{"a ready Mac", node(func(*v1alpha1.MacNode) {}), Mac{Name: "mac-1", Ceiling: 26 * gib, Committed: 6 * gib, Agent: gib / 4}},
		{"the operator's ceiling caps the report", node(func(mn *v1alpha1.MacNode) { mn.Spec.MemoryCeiling = q(20 * gib) }),
			Mac{Name: "mac-1", Ceiling: 20 * gib, Committed: 6 * gib, Agent: gib / 4}},
		{"a report above the measured memory is not believed", node(func(mn *v1alpha1.MacNode) { mn.Status.Memory.Ceiling = q(64 * gib) }),
			Mac{Name: "mac-1", Ceiling: 32 * gib, Committed: 6 * gib, Agent: gib / 4}},
		{"cordoned", node(func(mn *v1alpha1.MacNode) { mn.Spec.Unschedulable = true }),
			Mac{Name: "mac-1", Ceiling: 26 * gib, Committed: 6 * gib, Agent: gib / 4, Unavailable: "cordoned"}},
		{"not ready", node(func(mn *v1alpha1.MacNode) { mn.Status.Conditions = nil }),
			Mac{Name: "mac-1", Ceiling: 26 * gib, Committed: 6 * gib, Agent: gib / 4, Unavailable: "not Ready"}},
		{"being deleted", node(func(mn *v1alpha1.MacNode) { mn.DeletionTimestamp = &now }),
			Mac{Name: "mac-1", Ceiling: 26 * gib, Committed: 6 * gib, Agent: gib / 4, Unavailable: "being deleted"}},
		{"no ceiling yet", node(func(mn *v1alpha1.MacNode) { mn.Status.Memory = v1alpha1.NodeMemoryStatus{} }),
			Mac{Name: "mac-1", Unavailable: "its agent has reported no memory ceiling"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, FromMacNode(tc.mn)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestNeeds: the needs are the estimate's own figures at each context, Parallel ×
// context in all, growing with the context, read from one header.
func TestNeeds(t *testing.T) {
	spec := ggufsynth.EightB(ggufsynth.Q4_0)
	spec.Ctx = 40960
	path := filepath.Join(t.TempDir(), "8b.gguf")
	if err := ggufsynth.WriteHeader(path, spec); err != nil {
		t.Fatal(err)
	}
	h, err := estimate.ReadHeader(t.Context(), estimate.Params{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	s := Settings{Parallel: 2, KVCacheType: estimate.KVQ8_0}
	m, needs, err := Needs(h, "file://"+path, []int64{4096, 16384}, s, Beside{})
	if err != nil {
		t.Fatal(err)
	}
	if m.TrainedContext != 40960 || m.Architecture == "" || m.Weights <= 0 || m.Parameters != spec.Params() {
		t.Errorf("model %+v: want trained context 40960, an architecture, weights and %d parameters", m, spec.Params())
	}
	for _, n := range needs {
		want, err := estimate.Estimate(t.Context(), estimate.Params{Path: path, ContextLength: int32(2 * n.Context), Parallel: 2, KVCacheType: estimate.KVQ8_0})
		if err != nil {
			t.Fatal(err)
		}
		if n.Bytes != want.Total {
			t.Errorf("need at %d: %d bytes, the estimate of parallel 2 × %d says %d", n.Context, n.Bytes, n.Context, want.Total)
		}
	}
	if len(needs) != 2 || needs[1].Bytes <= needs[0].Bytes {
		t.Errorf("needs %+v: want two, the larger context needing more", needs)
	}
	// A projector is counted in every need, as the manager counts it.
	proj := &Projector{Source: "hf://org/repo/mmproj.gguf", Bytes: 600 << 20}
	pm, withProj, err := Needs(h, "file://"+path, []int64{4096, 16384}, s, Beside{Projector: proj})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range withProj {
		if n.Context != needs[i].Context || n.Bytes != needs[i].Bytes+proj.Bytes {
			t.Errorf("need with the projector %+v, want %+v and the projector's %d bytes", n, needs[i], proj.Bytes)
		}
	}
	if pm.Projector != proj {
		t.Errorf("model %+v, want the projector named", pm)
	}
	if _, _, err := Needs(h, "x", []int64{1 << 30}, s, Beside{}); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("a context over the estimate's range: %v, want out of range", err)
	}
}

func TestReportWrite(t *testing.T) {
	needs := []Need{{Context: 4096, Bytes: 5 * gib}, {Context: 40960, Bytes: 9 * gib}}
	r := Report{Model: Model{Source: "hf://org/repo/m.gguf", Architecture: "llama", Parameters: 7_200_000_000, Weights: 4 * gib, TrainedContext: 40960},
		Where: "two Macs", Needs: needs,
		Macs: Decide([]Mac{{Name: "big", Ceiling: 20 * gib}, {Name: "busy", Ceiling: 10 * gib, Committed: 4 * gib, Unavailable: "cordoned"}}, needs)}
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"hf://org/repo/m.gguf", "llama, 7.2B parameters, 4.0 GiB of weights, trained context 40k", "parallel 1, KV cache f16",
		"big (20.0 GiB free of 20.0 GiB)", "busy (6.0 GiB free of 10.0 GiB)",
		"40k", "yes, 11.0 GiB left", "once freed (3.0 GiB short now)",
		"big: up to 40k context now\n",
		"busy: up to 4k context now, up to 40k context once its models (4.0 GiB committed) are unloaded; but it takes no new replicas now: cordoned",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "projector") {
		t.Errorf("the table of a model without a projector names one:\n%s", out)
	}
	r.Model.Projector = &Projector{Source: "hf://org/repo/mmproj.gguf", Bytes: 600 << 20}
	b.Reset()
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	if want := "with its projector hf://org/repo/mmproj.gguf: 600.0 MiB, counted in every need\n"; !strings.Contains(b.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, b.String())
	}
}
