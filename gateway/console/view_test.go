package console

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"

	"github.com/macfleet/macfleet/internal/bytesize"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func q(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func mac(name string, ready metav1.ConditionStatus, since time.Duration, mem mfv1.NodeMemoryStatus) mfv1.MacNode {
	n := mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Hardware.Chip = "Apple M2 Pro"
	n.Status.Memory = mem
	n.Status.Conditions = []metav1.Condition{{Type: mfv1.MacNodeReady, Status: ready, Reason: mfv1.ReasonAgentReady,
		LastTransitionTime: metav1.NewTime(now.Add(-since))}}
	return n
}

func rep(ns, name, dep, node, resident string, conds ...metav1.Condition) mfv1.ModelReplica {
	r := mfv1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{mfv1.LabelDeployment: dep}}}
	r.Spec.NodeName = node
	r.Spec.MemoryReservation = resource.MustParse("1Gi")
	if resident != "" {
		r.Status.Memory.Resident = q(resident)
	}
	r.Status.Conditions = conds
	return r
}

func cond(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg}
}

func TestHumanBytesAndAge(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536 << 20: "1.5 GiB", 16 << 30: "16.0 GiB"} {
		if got := bytesize.Format(n); got != want {
			t.Errorf("bytesize.Format(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{-time.Second: "0s", 5 * time.Second: "5s", 90 * time.Second: "1m",
		3 * time.Hour: "3h", 72 * time.Hour: "3d"} {
		if got := Age(now, metav1.NewTime(now.Add(-d))); got != want {
			t.Errorf("Age(%v) = %q, want %q", d, got, want)
		}
	}
	if got := Age(now, metav1.Time{}); got != "" {
		t.Errorf("Age(zero) = %q", got)
	}
}

func TestBuildFleet(t *testing.T) {
	full := mfv1.NodeMemoryStatus{Ceiling: q("10Gi"), SoftWatermark: q("8Gi"), HardWatermark: q("9Gi"),
		Used: q("6Gi"), Committed: q("5Gi"), Pressure: mfv1.PressureOK, Evictions: 2, FreedBytesTotal: 3 << 30}
	tests := []struct {
		name      string
		snap      Snapshot
		wantReady int
		wantNodes []string
		// per node: segments as label→percent, markers as class→percent
		wantSegs    map[string][]Segment
		wantMarkers map[string][]float64
	}{
		{name: "empty fleet", snap: Snapshot{Now: now}},
		{
			name: "models stacked before the rest of used memory, watermarks as markers",
			snap: Snapshot{Now: now, Nodes: []mfv1.MacNode{mac("mac-b", metav1.ConditionTrue, time.Minute, full)},
				Replicas: []mfv1.ModelReplica{
					rep("a", "qwen-0", "qwen", "mac-b", "2Gi"),
					rep("a", "llama-0", "llama", "mac-b", "1Gi"),
					rep("a", "pending-0", "pending", "", ""),
				}},
			wantReady: 1, wantNodes: []string{"mac-b"},
			wantSegs: map[string][]Segment{"mac-b": {
				{Label: "llama", Bytes: bytesOf(1 << 30), Offset: 0, Percent: 10, Class: "model"},
				{Label: "qwen", Bytes: bytesOf(2 << 30), Offset: 10, Percent: 20, Class: "model"},
				{Label: "other (agent, system)", Bytes: bytesOf(3 << 30), Offset: 30, Percent: 30, Class: "other"},
			}},
			wantMarkers: map[string][]float64{"mac-b": {50, 80, 90}},
		},
		{
			name: "a Mac over its ceiling scales the bar to what it uses; sorted by name",
			snap: Snapshot{Now: now, Nodes: []mfv1.MacNode{
				mac("mac-z", metav1.ConditionUnknown, time.Hour, mfv1.NodeMemoryStatus{Ceiling: q("4Gi"), Used: q("8Gi")}),
				mac("mac-a", metav1.ConditionTrue, time.Hour, mfv1.NodeMemoryStatus{}),
			}, Replicas: []mfv1.ModelReplica{rep("a", "big-0", "big", "mac-z", "8Gi")}},
			wantReady: 1, wantNodes: []string{"mac-a", "mac-z"},
			wantSegs: map[string][]Segment{"mac-a": nil, "mac-z": {
				{Label: "big", Bytes: bytesOf(8 << 30), Percent: 100, Class: "model"},
			}},
			wantMarkers: map[string][]float64{"mac-a": nil, "mac-z": nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := BuildFleet(tt.snap)
			if p.Ready != tt.wantReady {
				t.Errorf("Ready = %d, want %d", p.Ready, tt.wantReady)
			}
			var names []string
			for _, n := range p.Nodes {
				names = append(names, n.Name)
				if diff := cmp.Diff(tt.wantSegs[n.Name], n.Bar.Segments); diff != "" {
					t.Errorf("%s segments (-want +got):\n%s", n.Name, diff)
				}
				var marks []float64
				for _, m := range n.Bar.Markers {
					marks = append(marks, m.Percent)
				}
				if diff := cmp.Diff(tt.wantMarkers[n.Name], marks); diff != "" {
					t.Errorf("%s markers (-want +got):\n%s", n.Name, diff)
				}
			}
			if diff := cmp.Diff(tt.wantNodes, names); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildFleetRowNumbers(t *testing.T) {
	mem := mfv1.NodeMemoryStatus{Ceiling: q("10Gi"), Used: q("6Gi"), Pressure: mfv1.PressureSoft, Evictions: 4, FreedBytesTotal: 5 << 30}
	renewed := metav1.NewMicroTime(now.Add(-7 * time.Second))
	leases := []coordinationv1.Lease{
		{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: coordinationv1.LeaseSpec{RenewTime: &renewed}},
		{ObjectMeta: metav1.ObjectMeta{Name: "m2"}}, // never renewed
	}
	p := BuildFleet(Snapshot{Now: now, Leases: leases, Nodes: []mfv1.MacNode{mac("m1", metav1.ConditionTrue, 90*time.Second, mem),
		mac("m2", metav1.ConditionUnknown, time.Hour, mem), mac("m3", metav1.ConditionTrue, time.Minute, mem)}})
	r := p.Nodes[0]
	got := []any{r.Chip, r.Ready, r.ReadyReason, r.ReadyFor, r.LeaseAge, r.Used.N, r.Ceiling.N, r.Pressure, r.Evictions, r.Freed.Text,
		r.Bar.Summary, p.Used.Text, p.Freed.N, p.Evictions}
	want := []any{"Apple M2 Pro", "True", mfv1.ReasonAgentReady, "1m", "7s", int64(6 << 30), int64(10 << 30), "Soft", int64(4), "5.0 GiB",
		"6.0 GiB used of 10.0 GiB ceiling; other (agent, system) 6.0 GiB", "18.0 GiB", int64(15 << 30), int64(12)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
	// A Lease never renewed, or none at all, shows no age.
	if a, b := p.Nodes[1].LeaseAge, p.Nodes[2].LeaseAge; a != "" || b != "" {
		t.Errorf("lease ages of m2 (never renewed) and m3 (no Lease) = %q, %q; want none", a, b)
	}
}

func TestBuildModels(t *testing.T) {
	d := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "qwen"}}
	d.Spec.Replicas = ptr.To(int32(3))
	d.Spec.Model.ServedName = "qwen-7b"
	d.Status.ReadyReplicas = 1
	d.Status.EstimatedMemory, d.Status.MeasuredMemory = q("5Gi"), q("4Gi")
	d.Status.Conditions = []metav1.Condition{
		cond(mfv1.DeploymentScheduled, metav1.ConditionFalse, mfv1.ReasonUnschedulable, "0/2 Macs fit: 2 insufficient memory"),
		cond(mfv1.DeploymentAvailable, metav1.ConditionTrue, mfv1.ReasonMinimumReplicasAvailable, ""),
		cond(mfv1.DeploymentProgressing, metav1.ConditionFalse, "x", "not a problem"),
	}
	downloading := rep("a", "qwen-1", "qwen", "m2", "", cond(mfv1.ReplicaDownloaded, metav1.ConditionFalse, mfv1.ReasonDownloading, "1.0 of 4.0 GiB"))
	downloading.Status.Phase = mfv1.ReplicaDownloading
	downloading.Status.Progress = &mfv1.DownloadProgress{DownloadedBytes: 1, TotalBytes: 4}
	draining := rep("a", "qwen-4", "qwen", "m4", "", cond(mfv1.ReplicaReady, metav1.ConditionTrue, mfv1.ReasonRunnerReady, ""))
	draining.Spec.Drain = &metav1.Time{Time: now}
	snap := Snapshot{Now: now, Deployments: []mfv1.ModelDeployment{d}, Replicas: []mfv1.ModelReplica{
		draining,
		rep("a", "qwen-2", "qwen", "", ""),
		downloading,
		rep("a", "qwen-0", "qwen", "m1", "4Gi", cond(mfv1.ReplicaReady, metav1.ConditionTrue, mfv1.ReasonRunnerReady, "")),
		rep("a", "qwen-3", "qwen", "m3", ""),
		rep("b", "qwen-0", "qwen", "m1", "1Gi"), // another namespace's deployment of the same name
	}}
	p := BuildModels(snap)
	if len(p.Deployments) != 1 {
		t.Fatalf("deployments: %+v", p.Deployments)
	}
	row := p.Deployments[0]
	if diff := cmp.Diff([]string{"Scheduled: 0/2 Macs fit: 2 insufficient memory"}, row.Problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	type brief struct{ Name, Node, Phase, Progress, Why string }
	var got []brief
	for _, r := range row.Replicas {
		got = append(got, brief{r.Name, r.Node, r.Phase, r.Progress, r.Why})
	}
	want := []brief{
		{"qwen-0", "m1", "Pending", "", ""},
		{"qwen-1", "m2", "Downloading", "25%", "Downloaded: 1.0 of 4.0 GiB"},
		{"qwen-2", "", "Pending", "", "not placed: 0/2 Macs fit: 2 insufficient memory"},
		{"qwen-3", "m3", "Pending", "", "waiting for the agent on m3 (Downloaded not reported)"},
		{"qwen-4", "m4", "Draining", "", "being removed: its requests finish and its model is unloaded, then it is deleted"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
	if row.Served != "qwen-7b" || row.Model != "a/qwen" || row.Desired != 3 || row.Ready != 1 ||
		row.Estimated.Text != "5.0 GiB" || row.Measured.N != 4<<30 {
		t.Errorf("deployment row %+v", row)
	}
}

func TestBuildUnloads(t *testing.T) {
	unloaded := func(ns, name, node string, ago time.Duration, freed int64) mfv1.ModelReplica {
		r := rep(ns, name, "qwen", node, "")
		r.Status.LastUnload = &mfv1.UnloadReport{Reason: "Idle", FreedBytes: freed, ResidentBytes: freed + 1,
			Outcome: mfv1.UnloadSettled, Duration: metav1.Duration{Duration: 1234567 * time.Microsecond},
			Time: metav1.NewTime(now.Add(-ago))}
		return r
	}
	reps := []mfv1.ModelReplica{unloaded("a", "old", "m1", time.Hour, 1<<30), rep("a", "never", "qwen", "m1", ""),
		unloaded("a", "new", "m2", time.Minute, 2<<30)}
	for i := range MaxUnloads {
		reps = append(reps, unloaded("z", "filler-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "m3", 2*time.Hour, 1))
	}
	p := BuildUnloads(Snapshot{Now: now, Replicas: reps})
	if len(p.Unloads) != MaxUnloads {
		t.Fatalf("%d unloads, want %d", len(p.Unloads), MaxUnloads)
	}
	got := []any{p.Unloads[0].Replica, p.Unloads[0].Node, p.Unloads[0].Ago, p.Unloads[0].Duration, p.Unloads[0].Freed.N,
		p.Unloads[1].Replica, p.Unloads[2].Namespace}
	want := []any{"new", "m2", "1m", "1.235s", int64(2 << 30), "old", "z"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unloads (-want +got):\n%s", diff)
	}
	if want := int64(3<<30) + MaxUnloads - 2; p.Freed.N != want {
		t.Errorf("freed = %d, want %d", p.Freed.N, want)
	}
}

func TestBuildPlayground(t *testing.T) {
	dep := func(ns, name, served string, ready int32) mfv1.ModelDeployment {
		d := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		d.Spec.Model.ServedName = served
		d.Status.ReadyReplicas = ready
		return d
	}
	got := BuildPlayground(Snapshot{Deployments: []mfv1.ModelDeployment{
		dep("a", "cold", "", 0), dep("a", "qwen", "chat", 1), dep("b", "qwen", "chat", 2), dep("a", "tiny", "", 1),
	}})
	want := []PlaygroundModel{
		{Model: "a/qwen", Label: "chat (a)", Ready: true},
		{Model: "tiny", Label: "tiny (a)", Ready: true},
		{Model: "b/qwen", Label: "chat (b)", Ready: true},
		{Model: "cold", Label: "cold (a) — no ready replica"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestTrafficRow(t *testing.T) {
	for _, tt := range []struct {
		in   Traffic
		want TrafficRow
	}{
		{Traffic{}, TrafficRow{Rate: "0.0 req/s", TTFT: "TTFT —", Load: "0 in flight, 0 queued"}},
		{Traffic{RequestsPerSecond: 4.25, TTFTp50: 45 * time.Millisecond, TTFTp99: 12500 * time.Millisecond, TTFTSamples: 32,
			InFlight: 5, Queued: 3},
			TrafficRow{Rate: "4.2 req/s", TTFT: "TTFT p50 45 ms, p99 12.5 s (32 requests)", Load: "5 in flight, 3 queued", Queued: 3}},
	} {
		if got := trafficRow(tt.in); got != tt.want {
			t.Errorf("trafficRow(%+v) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
	d := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "qwen"}}
	p := BuildModels(Snapshot{Now: now, Deployments: []mfv1.ModelDeployment{d},
		Traffic: map[string]Traffic{"a/qwen": {RequestsPerSecond: 2, Queued: 1}, "b/qwen": {Queued: 9}}})
	if got := p.Deployments[0].Traffic; got.Rate != "2.0 req/s" || got.Queued != 1 {
		t.Errorf("the models page's traffic of a/qwen: %+v", got)
	}
}

// The fleet page shows the ceiling the scheduler places replicas by: a Mac that
// reports more than its chip has, or than the operator's bound, shows the cap, its
// report beside it, and counts the cap in the fleet's total.
func TestBuildFleetShowsTheEffectiveCeiling(t *testing.T) {
	honest := mac("a-honest", metav1.ConditionTrue, time.Minute, mfv1.NodeMemoryStatus{Ceiling: q("10Gi"), Used: q("2Gi")})
	liar := mac("b-liar", metav1.ConditionTrue, time.Minute, mfv1.NodeMemoryStatus{Ceiling: q("1Ti"), Used: q("2Gi")})
	liar.Status.Hardware.Chip = "Apple M4"
	bounded := mac("c-bounded", metav1.ConditionTrue, time.Minute, mfv1.NodeMemoryStatus{Ceiling: q("28Gi"), Used: q("2Gi")})
	bounded.Spec.MemoryCeiling = q("8Gi")
	p := BuildFleet(Snapshot{Now: now, Nodes: []mfv1.MacNode{liar, bounded, honest}})
	var got [][]any
	for _, r := range p.Nodes {
		got = append(got, []any{r.Name, r.Ceiling.Text, r.Reported.Text, r.CappedBy, r.Bar.Summary})
	}
	want := [][]any{
		{"a-honest", "10.0 GiB", "10.0 GiB", "", "2.0 GiB used of 10.0 GiB ceiling; other (agent, system) 2.0 GiB"},
		{"b-liar", "32.0 GiB", "1.0 TiB", "Chip", "2.0 GiB used of 32.0 GiB ceiling (the Mac reports 1.0 TiB, capped by the chip's memory); other (agent, system) 2.0 GiB"},
		{"c-bounded", "8.0 GiB", "28.0 GiB", "Operator", "2.0 GiB used of 8.0 GiB ceiling (the Mac reports 28.0 GiB, capped by spec.memoryCeiling); other (agent, system) 2.0 GiB"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if p.Ceiling.Text != "50.0 GiB" {
		t.Errorf("fleet ceiling %s, want 50.0 GiB (10 + 32 + 8)", p.Ceiling.Text)
	}
}
