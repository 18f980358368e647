package macnode

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

func TestChipLabelValue(t *testing.T) {
	tests := []struct{ chip, want string }{
		{"Apple M2 Max", "Apple-M2-Max"},
		{"Apple M4 Pro", "Apple-M4-Pro"},
		{"Intel(R) Xeon(R) CPU @ 2.20GHz", "Intel-R-Xeon-R-CPU-2.20GHz"},
		{"  (Apple M1)  ", "Apple-M1"},
		{"AMD EPYC 7B13 64-Core Processor", "AMD-EPYC-7B13-64-Core-Processor"},
		{"Raspberry Pi 4 Model B Rev 1.4", "Raspberry-Pi-4-Model-B-Rev-1.4"},
		{"_under_score_", "under_score"},
		{"Äpple M2", "pple-M2"},
		{"", ""},
		{"@@@", ""},
		{strings.Repeat("M2 ", 40), strings.TrimSuffix(strings.Repeat("M2-", 21), "-")},
	}
	for _, tt := range tests {
		t.Run(tt.chip, func(t *testing.T) {
			got := ChipLabelValue(tt.chip)
			if got != tt.want {
				t.Errorf("ChipLabelValue(%q) = %q, want %q", tt.chip, got, tt.want)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Errorf("ChipLabelValue(%q) = %q is not a label value: %v", tt.chip, got, errs)
			}
		})
	}
}

func TestLabels(t *testing.T) {
	tests := []struct {
		name string
		hw   hardware.Info
		want map[string]string
	}{
		{
			name: "a Mac",
			hw:   hardware.Info{Chip: "Apple M2 Max", UnifiedMemoryBytes: 32 * gib, Arch: "arm64", OS: "darwin"},
			want: map[string]string{v1alpha1.LabelChip: "Apple-M2-Max", v1alpha1.LabelMemoryGiB: "32",
				"kubernetes.io/arch": "arm64", "kubernetes.io/os": "darwin"},
		},
		{
			name: "a Linux host's memory rounds to the nearest GiB",
			hw:   hardware.Info{Chip: "Intel(R) Xeon(R) CPU @ 2.20GHz", UnifiedMemoryBytes: 24583016 * 1024, Arch: "amd64", OS: "linux"},
			want: map[string]string{v1alpha1.LabelChip: "Intel-R-Xeon-R-CPU-2.20GHz", v1alpha1.LabelMemoryGiB: "23",
				"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"},
		},
		{
			name: "unknown figures are left out",
			hw:   hardware.Info{Arch: "arm64", OS: "darwin"},
			want: map[string]string{"kubernetes.io/arch": "arm64", "kubernetes.io/os": "darwin"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Labels(tt.hw)); diff != "" {
				t.Errorf("Labels (-want +got):\n%s", diff)
			}
		})
	}
}

func qty(b int64) *resource.Quantity { return resource.NewQuantity(b, resource.BinarySI) }

var quantityCmp = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func TestApplyStatus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	hw := hardware.Info{Chip: "Apple M2", CPUCores: 8, PerformanceCores: 4, GPUCores: 10, UnifiedMemoryBytes: 16 * gib,
		MetalWorkingSetBytes: 10 * gib, Arch: "arm64", OS: "darwin"}
	mem := Memory{CeilingBytes: 10 * gib, SoftWatermarkBytes: 9 * gib, HardWatermarkBytes: 9*gib + gib/2,
		UsedBytes: 3 * gib, AgentBytes: 64 << 20, CommittedBytes: 5 * gib, Pressure: v1alpha1.PressureOK, Evictions: 1, FreedBytesTotal: 2 * gib}
	ready := statusInputs{hardware: hw, version: "v1", address: "10.0.0.2:8080", memory: &mem,
		ready: metav1.ConditionTrue, readyReason: v1alpha1.ReasonAgentReady, readyMessage: "alive"}
	cond := func(typ string, status metav1.ConditionStatus, reason string, at time.Time) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(at), ObservedGeneration: 3}
	}
	other := metav1.Condition{Type: "Maintenance", Status: metav1.ConditionTrue, Reason: "Admin", LastTransitionTime: metav1.NewTime(t0)}

	tests := []struct {
		name     string
		existing []metav1.Condition
		in       statusInputs
		want     []metav1.Condition
	}{
		{
			name: "first write",
			in:   ready,
			want: []metav1.Condition{cond("Ready", "True", "AgentReady", t1), cond("MemoryPressure", "False", "PressureOK", t1)},
		},
		{
			name:     "Ready=Unknown from the controller is restored and transitions now",
			existing: []metav1.Condition{cond("Ready", "Unknown", v1alpha1.ReasonLeaseExpired, t0), cond("MemoryPressure", "False", "PressureOK", t0), other},
			in:       ready,
			want:     []metav1.Condition{cond("Ready", "True", "AgentReady", t1), cond("MemoryPressure", "False", "PressureOK", t0), other},
		},
		{
			name:     "hard pressure",
			existing: []metav1.Condition{cond("Ready", "True", "AgentReady", t0), cond("MemoryPressure", "False", "PressureOK", t0)},
			in: func() statusInputs {
				in := ready
				m := mem
				m.Pressure = v1alpha1.PressureHard
				in.memory = &m
				return in
			}(),
			want: []metav1.Condition{cond("Ready", "True", "AgentReady", t0), cond("MemoryPressure", "True", v1alpha1.ReasonPressureHard, t1)},
		},
		{
			name:     "stopping",
			existing: []metav1.Condition{cond("Ready", "True", "AgentReady", t0)},
			in: statusInputs{hardware: hw, ready: metav1.ConditionFalse, readyReason: v1alpha1.ReasonAgentStopping,
				readyMessage: "bye"},
			want: []metav1.Condition{cond("Ready", "False", v1alpha1.ReasonAgentStopping, t1)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "m", Generation: 3}}
			node.Status.Conditions = append([]metav1.Condition(nil), tt.existing...)
			for i := range node.Status.Conditions {
				if node.Status.Conditions[i].Type != other.Type {
					node.Status.Conditions[i].ObservedGeneration = 3
				}
			}
			applyStatus(node, tt.in, t1)
			if diff := cmp.Diff(tt.want, node.Status.Conditions,
				cmpopts.IgnoreFields(metav1.Condition{}, "Message"), cmpopts.SortSlices(func(a, b metav1.Condition) bool { return a.Type < b.Type })); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			wantHW := v1alpha1.HardwareStatus{Chip: "Apple M2", CPUCores: 8, PerformanceCores: 4, GPUCores: 10, UnifiedMemory: qty(16 * gib), MetalWorkingSet: qty(10 * gib)}
			if diff := cmp.Diff(wantHW, node.Status.Hardware, quantityCmp); diff != "" {
				t.Errorf("hardware (-want +got):\n%s", diff)
			}
			if tt.in.memory != nil {
				m := *tt.in.memory
				want := v1alpha1.NodeMemoryStatus{Ceiling: qty(m.CeilingBytes), SoftWatermark: qty(m.SoftWatermarkBytes),
					HardWatermark: qty(m.HardWatermarkBytes), Used: qty(m.UsedBytes), Agent: qty(64 << 20), Committed: qty(m.CommittedBytes),
					Pressure: m.Pressure, Evictions: 1, FreedBytesTotal: 2 * gib}
				if diff := cmp.Diff(want, node.Status.Memory, quantityCmp); diff != "" {
					t.Errorf("memory (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestPressureCondition(t *testing.T) {
	m := Memory{CeilingBytes: 10 * gib, SoftWatermarkBytes: 9 * gib, HardWatermarkBytes: 9*gib + gib/2}
	tests := []struct {
		level  v1alpha1.PressureLevel
		status metav1.ConditionStatus
		reason string
		names  string // the threshold the message names
	}{
		{"", metav1.ConditionFalse, v1alpha1.ReasonPressureOK, "9.0GiB"},
		{v1alpha1.PressureOK, metav1.ConditionFalse, v1alpha1.ReasonPressureOK, "9.0GiB"},
		{v1alpha1.PressureSoft, metav1.ConditionTrue, v1alpha1.ReasonPressureSoft, "9.0GiB"},
		{v1alpha1.PressureHard, metav1.ConditionTrue, v1alpha1.ReasonPressureHard, "9.5GiB"},
		{v1alpha1.PressureEmergency, metav1.ConditionTrue, v1alpha1.ReasonPressureEmergency, "10.0GiB"},
	}
	for _, tt := range tests {
		t.Run(string(tt.level), func(t *testing.T) {
			m.Pressure = tt.level
			status, reason, msg := pressureCondition(m)
			if status != tt.status || reason != tt.reason || !strings.Contains(msg, tt.names) {
				t.Errorf("pressureCondition(%q) = %s, %s, %q; want %s, %s, a message naming %s", tt.level, status, reason, msg, tt.status, tt.reason, tt.names)
			}
		})
	}
}

func TestStatusChanged(t *testing.T) {
	base := v1alpha1.MacNodeStatus{Memory: v1alpha1.NodeMemoryStatus{Used: qty(gib), Committed: qty(2 * gib), Pressure: v1alpha1.PressureOK}}
	base.Display = &v1alpha1.MemoryDisplay{Used: "1.0 GiB", Committed: "2.0 GiB"}
	usedOnly := *base.DeepCopy()
	usedOnly.Memory.Used = qty(gib + 1)
	pressure := *usedOnly.DeepCopy()
	pressure.Memory.Pressure = v1alpha1.PressureSoft
	// The server returns 1Gi where the agent computed 1073741824: the same quantity.
	sameValue := *base.DeepCopy()
	sameValue.Memory.Used = resource.NewQuantity(gib, resource.DecimalSI)
	// kubectl's USED column moves with the usage, and is not due without it either.
	displayed := *usedOnly.DeepCopy()
	displayed.Display = &v1alpha1.MemoryDisplay{Used: "1.1 GiB", Committed: "2.0 GiB"}
	// The agent's own footprint drifts with every measurement, as the usage does.
	agentOnly := *usedOnly.DeepCopy()
	agentOnly.Memory.Agent = qty(64 << 20)
	tests := []struct {
		name  string
		after v1alpha1.MacNodeStatus
		usage bool
		want  bool
	}{
		{"unchanged", base, true, false},
		{"same quantity in another form", sameValue, false, false},
		{"usage alone, usage due", usedOnly, true, true},
		{"usage alone, usage not due", usedOnly, false, false},
		{"usage and its display, usage not due", displayed, false, false},
		{"usage and its display, usage due", displayed, true, true},
		{"pressure changed, usage not due", pressure, false, true},
		{"usage and the agent's own, usage not due", agentOnly, false, false},
		{"usage and the agent's own, usage due", agentOnly, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := statusChanged(base, tt.after, tt.usage); got != tt.want {
				t.Errorf("statusChanged = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMemoryFromSnapshot(t *testing.T) {
	s := enginepool.Snapshot{
		Ceiling:    enginepool.Ceiling{Bytes: 10 * gib, SoftBytes: 9 * gib, HardBytes: 9*gib + gib/2},
		UsageBytes: 3 * gib, AgentBytes: 60 << 20, CommittedBytes: 4 * gib, Pressure: enginepool.PressureHard, Evictions: 7, FreedBytesTotal: 5 * gib,
	}
	want := Memory{CeilingBytes: 10 * gib, SoftWatermarkBytes: 9 * gib, HardWatermarkBytes: 9*gib + gib/2, UsedBytes: 3 * gib,
		AgentBytes: 60 << 20, CommittedBytes: 4 * gib, Pressure: v1alpha1.PressureHard, Evictions: 7, FreedBytesTotal: 5 * gib}
	if diff := cmp.Diff(want, MemoryFromSnapshot(s)); diff != "" {
		t.Errorf("MemoryFromSnapshot (-want +got):\n%s", diff)
	}
	for in, want := range map[enginepool.PressureLevel]v1alpha1.PressureLevel{
		enginepool.PressureOK: v1alpha1.PressureOK, enginepool.PressureSoft: v1alpha1.PressureSoft, enginepool.PressureHard: v1alpha1.PressureHard,
		enginepool.PressureEmergency: v1alpha1.PressureEmergency, "": v1alpha1.PressureOK,
	} {
		if got := PressureLevel(in); got != want {
			t.Errorf("PressureLevel(%q) = %q, want %q", in, got, want)
		}
	}
	if got := PoolMemory(snapshotter(s)).NodeMemory(); got != want {
		t.Errorf("PoolMemory = %+v, want %+v", got, want)
	}
}

type snapshotter enginepool.Snapshot

func (s snapshotter) Snapshot() enginepool.Snapshot { return enginepool.Snapshot(s) }
