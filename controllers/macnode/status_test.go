package macnode

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestSetReadyUnknown(t *testing.T) {
	now := t0.Add(time.Minute)
	pressure := metav1.Condition{Type: v1alpha1.MacNodeMemoryPressure, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPressureOK, LastTransitionTime: metav1.NewTime(t0)}
	unknown := func(since time.Time, msg string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionUnknown, ObservedGeneration: 3,
			Reason: v1alpha1.ReasonLeaseExpired, Message: msg, LastTransitionTime: metav1.NewTime(since)}
	}
	tests := []struct {
		name        string
		conds       []metav1.Condition
		wantConds   []metav1.Condition
		wantChanged bool
	}{{
		name:        "no conditions yet",
		wantConds:   []metav1.Condition{unknown(now, "m")},
		wantChanged: true,
	}, {
		name: "Ready=True turns Unknown at now; other conditions untouched",
		conds: []metav1.Condition{
			{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady, Message: "ok", ObservedGeneration: 3, LastTransitionTime: metav1.NewTime(t0)},
			pressure,
		},
		wantConds:   []metav1.Condition{unknown(now, "m"), pressure},
		wantChanged: true,
	}, {
		name:      "already Unknown with the same message: no change",
		conds:     []metav1.Condition{pressure, unknown(t0, "m")},
		wantConds: []metav1.Condition{pressure, unknown(t0, "m")},
	}, {
		name:        "already Unknown, new message: keeps the transition time",
		conds:       []metav1.Condition{unknown(t0, "old")},
		wantConds:   []metav1.Condition{unknown(t0, "m")},
		wantChanged: true,
	}, {
		name: "Unknown for another reason: reason replaced, transition time kept",
		conds: []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionUnknown, Reason: "AgentStarting",
			ObservedGeneration: 3, LastTransitionTime: metav1.NewTime(t0)}},
		wantConds:   []metav1.Condition{unknown(t0, "m")},
		wantChanged: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-1", Generation: 3}, Status: v1alpha1.MacNodeStatus{Conditions: tt.conds}}
			changed := setReadyUnknown(n, "m", now)
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			if diff := cmp.Diff(tt.wantConds, n.Status.Conditions); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetReplicaUnreachable(t *testing.T) {
	now := time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		ready       *metav1.ConditionStatus
		wantChanged bool
	}{
		{name: "ready replica", ready: ptr.To(metav1.ConditionTrue), wantChanged: true},
		{name: "not ready", ready: ptr.To(metav1.ConditionFalse)},
		{name: "already unknown", ready: ptr.To(metav1.ConditionUnknown)},
		{name: "no Ready condition", ready: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr := &v1alpha1.ModelReplica{}
			if tc.ready != nil {
				mr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ReplicaReady, Status: *tc.ready, Reason: "X"}}
			}
			before := mr.DeepCopy()
			if got := setReplicaUnreachable(mr, "mac-1", now); got != tc.wantChanged {
				t.Fatalf("changed = %v, want %v", got, tc.wantChanged)
			}
			if !tc.wantChanged {
				if diff := cmp.Diff(before, mr); diff != "" {
					t.Errorf("unchanged replica was modified (-before +after):\n%s", diff)
				}
				return
			}
			c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaReady)
			if c.Status != metav1.ConditionUnknown || c.Reason != v1alpha1.ReasonNodeUnreachable ||
				!c.LastTransitionTime.Time.Equal(now) || c.Message == "" {
				t.Errorf("Ready = %+v", c)
			}
		})
	}
}

// ceilingNode is a MacNode of chip reporting a ceiling (none if "") under the
// operator's bound spec ("" for none).
func ceilingNode(chip, reported, spec string) *v1alpha1.MacNode {
	n := &v1alpha1.MacNode{}
	n.Status.Hardware.Chip = chip
	if reported != "" {
		n.Status.Memory.Ceiling = ptr.To(resource.MustParse(reported))
	}
	if spec != "" {
		n.Spec.MemoryCeiling = ptr.To(resource.MustParse(spec))
	}
	return n
}

func TestSetCeilingCapped(t *testing.T) {
	node := func(chip, reported, spec string, conds ...metav1.Condition) *v1alpha1.MacNode {
		n := ceilingNode(chip, reported, spec)
		n.Status.Conditions = conds
		return n
	}
	capped := metav1.Condition{Type: v1alpha1.MacNodeCeilingCapped, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonChipMemoryExceeded, Message: "old", LastTransitionTime: metav1.NewTime(t0)}
	tests := []struct {
		name        string
		node        *v1alpha1.MacNode
		wantReason  string
		wantIn      []string
		wantChanged bool
	}{
		{name: "honest report: no condition", node: node("Apple M4", "28Gi", "")},
		{name: "no report yet: no condition", node: node("Apple M4", "", "")},
		{name: "back within bounds: removed", node: node("Apple M4", "28Gi", "", capped), wantChanged: true},
		{name: "beyond the chip", node: node("Apple M4", "1Ti", ""), wantChanged: true,
			wantReason: v1alpha1.ReasonChipMemoryExceeded, wantIn: []string{"1.0 TiB", "Apple M4", "32.0 GiB", "spec.memoryCeiling", "--chip"}},
		{name: "unknown chip", node: node("Apple M9", "1Ti", ""), wantChanged: true,
			wantReason: v1alpha1.ReasonChipMemoryExceeded, wantIn: []string{"1.0 TiB", "512.0 GiB", `"Apple M9"`, "not one macfleet knows", "spec.memoryCeiling"}},
		{name: "beyond the operator's bound", node: node("Apple M3 Ultra", "200Gi", "64Gi"), wantChanged: true,
			wantReason: v1alpha1.ReasonOperatorCeilingExceeded, wantIn: []string{"200.0 GiB", "spec.memoryCeiling 64.0 GiB", "check the Mac"}},
		{name: "beyond the memory measured", node: withMemory(node("Apple M4 Max", "100Gi", ""), "16Gi"), wantChanged: true,
			wantReason: v1alpha1.ReasonMeasuredMemoryExceeded, wantIn: []string{"100.0 GiB", "16.0 GiB of unified memory it measured",
				"remove status.effectiveCeiling", "spec.memoryCeiling"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changed := setCeilingCapped(tt.node, t0)
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			c := meta.FindStatusCondition(tt.node.Status.Conditions, v1alpha1.MacNodeCeilingCapped)
			if tt.wantReason == "" {
				if c != nil {
					t.Fatalf("condition %+v, want none", c)
				}
				return
			}
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != tt.wantReason {
				t.Fatalf("condition %+v, want True with reason %s", c, tt.wantReason)
			}
			for _, w := range tt.wantIn {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q lacks %q", c.Message, w)
				}
			}
			if setCeilingCapped(tt.node, t0.Add(time.Minute)) {
				t.Error("a second pass changed the condition")
			}
		})
	}
}

func TestSetEffectiveCeiling(t *testing.T) {
	node := func(chip, reported, spec string, cur *v1alpha1.EffectiveCeiling) *v1alpha1.MacNode {
		n := ceilingNode(chip, reported, spec)
		n.Status.EffectiveCeiling = cur
		return n
	}
	eff := func(q, display, source string) *v1alpha1.EffectiveCeiling {
		return &v1alpha1.EffectiveCeiling{Bytes: resource.MustParse(q), Display: display, Source: source}
	}
	tests := []struct {
		name        string
		node        *v1alpha1.MacNode
		want        *v1alpha1.EffectiveCeiling
		wantChanged bool
	}{
		{name: "no report yet: none", node: node("Apple M4", "", "", nil)},
		{name: "no report any more: removed", node: node("Apple M4", "", "", eff("28Gi", "28.0 GiB", "Reported")), wantChanged: true},
		{name: "honest report", node: node("Apple M4", "28Gi", "", nil), want: eff("28Gi", "28.0 GiB", "Reported"), wantChanged: true},
		{name: "already written", node: node("Apple M4", "28Gi", "", eff("28Gi", "28.0 GiB", "Reported")), want: eff("28Gi", "28.0 GiB", "Reported")},
		{name: "same bytes in another form", node: node("Apple M4", "28Gi", "", eff("29360128Ki", "28.0 GiB", "Reported")),
			want: eff("29360128Ki", "28.0 GiB", "Reported")},
		{name: "beyond the chip", node: node("Apple M4", "1Ti", "", eff("1Ti", "1.0 TiB", "Reported")), want: eff("32Gi", "32.0 GiB", "Chip"), wantChanged: true},
		{name: "beyond the operator's bound", node: node("Apple M3 Ultra", "200Gi", "64Gi", nil), want: eff("64Gi", "64.0 GiB", "Operator"), wantChanged: true},
		{name: "a report of nothing is nothing", node: node("Apple M4", "0", "8Gi", nil), want: eff("0", "0 B", "Reported"), wantChanged: true},
		{name: "the measured memory is kept", node: withMemory(node("Apple M4", "12Gi", "", nil), "16Gi"),
			want: kept(eff("12Gi", "12.0 GiB", "Reported"), "16Gi"), wantChanged: true},
		{name: "a larger claim later is not believed", node: withMemory(node("Apple M4 Max", "120Gi", "", kept(eff("12Gi", "12.0 GiB", "Reported"), "16Gi")), "128Gi"),
			want: kept(eff("16Gi", "16.0 GiB", "Measured"), "16Gi"), wantChanged: true},
		{name: "no ceiling reported: the measured memory stays", node: node("Apple M4", "", "", kept(eff("12Gi", "12.0 GiB", "Reported"), "16Gi")),
			want: kept(&v1alpha1.EffectiveCeiling{}, "16Gi"), wantChanged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if changed := setEffectiveCeiling(tt.node); changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			got := tt.node.Status.EffectiveCeiling
			if (got == nil) != (tt.want == nil) || got != nil && (got.Bytes.Cmp(tt.want.Bytes) != 0 ||
				got.Display != tt.want.Display || got.Source != tt.want.Source || !sameQuantity(got.MeasuredMemory, tt.want.MeasuredMemory)) {
				t.Fatalf("effectiveCeiling = %+v, want %+v", got, tt.want)
			}
			if setEffectiveCeiling(tt.node) {
				t.Error("a second pass changed it")
			}
		})
	}
}

// withMemory sets the unified memory n's agent reports.
func withMemory(n *v1alpha1.MacNode, q string) *v1alpha1.MacNode {
	n.Status.Hardware.UnifiedMemory = new(resource.MustParse(q))
	return n
}

// kept is e with measuredMemory q.
func kept(e *v1alpha1.EffectiveCeiling, q string) *v1alpha1.EffectiveCeiling {
	e.MeasuredMemory = new(resource.MustParse(q))
	return e
}
