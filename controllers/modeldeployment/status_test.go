package modeldeployment

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// replica builds a ModelReplica of template hash h; opts tweak it.
func replica(name, h string, opts ...func(*v1alpha1.ModelReplica)) v1alpha1.ModelReplica {
	mr := v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.ModelReplicaSpec{TemplateHash: h, MemoryReservation: resource.MustParse("1Gi")},
	}
	for _, o := range opts {
		o(&mr)
	}
	return mr
}

func bound(node string) func(*v1alpha1.ModelReplica) {
	return func(mr *v1alpha1.ModelReplica) { mr.Spec.NodeName = node }
}

func ready(mr *v1alpha1.ModelReplica) {
	meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunnerReady})
}

func unschedulable(msg string) func(*v1alpha1.ModelReplica) {
	return func(mr *v1alpha1.ModelReplica) {
		meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaScheduled, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonUnschedulable, Message: msg})
	}
}

func memory(peak, resident string) func(*v1alpha1.ModelReplica) {
	return func(mr *v1alpha1.ModelReplica) {
		if peak != "" {
			q := resource.MustParse(peak)
			mr.Status.Memory.Peak = &q
		}
		if resident != "" {
			q := resource.MustParse(resident)
			mr.Status.Memory.Resident = &q
		}
	}
}

// failing sets condition typ of a replica False with reason and msg.
func failing(typ, reason, msg string) func(*v1alpha1.ModelReplica) {
	return func(mr *v1alpha1.ModelReplica) {
		meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	}
}

func deleting(mr *v1alpha1.ModelReplica) {
	now := metav1.Now()
	mr.DeletionTimestamp = &now
}

func byHash(h string) func(*v1alpha1.ModelReplica) bool {
	return func(mr *v1alpha1.ModelReplica) bool { return mr.Spec.TemplateHash == h }
}

func TestSummarize(t *testing.T) {
	reps := []v1alpha1.ModelReplica{
		replica("a", "new", bound("mac-2"), ready, memory("3Gi", "2Gi")),
		replica("b", "new", bound("mac-1"), memory("", "5Gi")),
		replica("c", "old", bound("mac-2"), ready, memory("4Gi", "")),
		replica("e", "new", unschedulable("0/3 Macs fit: 3 insufficient memory")),
		replica("d", "new", unschedulable("0/3 Macs fit: 1 not ready")),
		replica("f", "new"),
		replica("g", "new", bound("mac-9"), ready, deleting, memory("9Gi", "")),
	}
	got := summarize(reps, byHash("new"))
	want := replicaSummary{
		Total: 6, Ready: 2, Updated: 5, UpdatedReady: 1, Old: 1, Unbound: 3,
		Unschedulable: 2, FirstUnschedulable: &reps[4].Status.Conditions[0],
		Nodes: []string{"mac-1", "mac-2"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summarize mismatch (-want +got):\n%s", diff)
	}
}

func TestSetStatus(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	q := resource.MustParse("422Mi")
	type conds map[string]string // type → "Status/Reason"
	tests := []struct {
		name      string
		desired   int32
		replicas  []v1alpha1.ModelReplica
		in        statusInput
		want      conds
		wantReady string
		wantMsg   map[string]string // type → substring of the message
	}{
		{
			name: "all ready", desired: 2,
			replicas: []v1alpha1.ModelReplica{replica("a", "h", bound("m1"), ready), replica("b", "h", bound("m2"), ready)},
			want: conds{"Available": "True/MinimumReplicasAvailable", "Progressing": "True/NewReplicasAvailable",
				"Scheduled": "True/AllReplicasScheduled"},
			wantReady: "2/2",
		},
		{
			name: "creating", desired: 2,
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "Unknown/SchedulingPending"},
			wantReady: "0/2",
			wantMsg:   map[string]string{"Scheduled": "2 of 2 replicas waiting for a Mac"},
		},
		{
			name: "waiting for the scheduler", desired: 2,
			replicas: []v1alpha1.ModelReplica{replica("a", "h", bound("m1"), ready), replica("b", "h")},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "Unknown/SchedulingPending"},
			wantReady: "1/2",
			wantMsg:   map[string]string{"Scheduled": "1 of 2 replicas waiting for a Mac", "Available": "1 of 2 replicas ready"},
		},
		{
			name: "unschedulable", desired: 3,
			replicas: []v1alpha1.ModelReplica{
				replica("a", "h", bound("m1"), ready),
				replica("c", "h", unschedulable("0/3 Macs fit: 2 insufficient memory (need 9.1GiB, largest free 6.0GiB), 1 not ready")),
				replica("b", "h", unschedulable("0/3 Macs fit: 3 not ready")),
			},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "False/Unschedulable"},
			wantReady: "1/3",
			wantMsg:   map[string]string{"Scheduled": "2 of 3 replicas unschedulable: 0/3 Macs fit: 3 not ready"},
		},
		{
			name: "rolling, old replicas keep it available", desired: 2,
			replicas: []v1alpha1.ModelReplica{
				replica("o1", "old", bound("m1"), ready), replica("o2", "old", bound("m2"), ready),
				replica("n1", "h", bound("m3")),
			},
			want: conds{"Available": "True/MinimumReplicasAvailable", "Progressing": "True/ReplicasUpdating",
				"Scheduled": "True/AllReplicasScheduled"},
			wantReady: "2/2",
			wantMsg:   map[string]string{"Progressing": "1 of 2 replicas updated, 0 ready; 2 old replicas left"},
		},
		{
			name: "estimate failed", desired: 2,
			in: statusInput{EstimateErr: errors.New("estimating the memory of hf://o/r/x.gguf: GET x: 404 Not Found")},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "False/MemoryEstimateFailed",
				"Scheduled": "False/MemoryEstimateFailed"},
			wantReady: "0/2",
			wantMsg:   map[string]string{"Scheduled": "404 Not Found"},
		},
		{
			name: "a replica fails its checksum", desired: 2,
			replicas: []v1alpha1.ModelReplica{
				replica("a", "h", bound("m1"), ready),
				replica("c", "h", bound("m3"), failing(v1alpha1.ReplicaDownloaded, v1alpha1.ReasonDownloadFailed, "GET x: 404 Not Found")),
				replica("b", "h", bound("m2"), failing(v1alpha1.ReplicaDownloaded, v1alpha1.ReasonChecksumMismatch,
					"sha256 mismatch for hf://o/r/x.gguf: expected aa, the downloaded file has bb; retrying at 2026-03-01T12:00:10Z")),
			},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "True/AllReplicasScheduled", "ReplicaFailure": "True/ChecksumMismatch"},
			wantReady: "1/2",
			wantMsg: map[string]string{"ReplicaFailure": "2 of 3 replicas failing; replica b on m2: Downloaded ChecksumMismatch: " +
				"sha256 mismatch for hf://o/r/x.gguf: expected aa, the downloaded file has bb"},
		},
		{
			name: "a replica fails to load", desired: 1,
			replicas: []v1alpha1.ModelReplica{replica("a", "h", bound("m1"),
				failing(v1alpha1.ReplicaLoaded, v1alpha1.ReasonLoadFailed, "the runner exited: unknown model architecture"))},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "True/AllReplicasScheduled", "ReplicaFailure": "True/LoadFailed"},
			wantReady: "0/1",
			wantMsg:   map[string]string{"ReplicaFailure": "replica a on m1: Loaded LoadFailed: the runner exited"},
		},
		{
			name: "a replica waits for the namespace's quota", desired: 2,
			replicas: []v1alpha1.ModelReplica{
				replica("a", "h", bound("m1"), ready),
				replica("b", "h", failing(v1alpha1.ReplicaScheduled, v1alpha1.ReasonQuotaExceeded,
					"namespace ns is out of fleet memory quota: the replica needs 8.0GiB, FleetQuota default allows 16.0GiB and 12.0GiB is in use")),
			},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "False/QuotaExceeded", "ReplicaFailure": "True/QuotaExceeded"},
			wantReady: "1/2",
			wantMsg: map[string]string{
				"Scheduled": "1 of 2 replicas unschedulable: namespace ns is out of fleet memory quota",
				"ReplicaFailure": "1 of 2 replicas failing; replica b on no Mac: Scheduled QuotaExceeded: " +
					"namespace ns is out of fleet memory quota: the replica needs 8.0GiB, FleetQuota default allows 16.0GiB and 12.0GiB is in use",
			},
		},
		{
			name: "source not allowed", desired: 2,
			in: statusInput{SourceErr: errors.New(`source host "x.example" is not allowed for namespace "ns": add it`)},
			want: conds{"Available": "False/MinimumReplicasUnavailable", "Progressing": "False/SourceNotAllowed",
				"Scheduled": "False/SourceNotAllowed"},
			wantReady: "0/2",
			wantMsg:   map[string]string{"Progressing": `source host "x.example" is not allowed`, "Scheduled": "add it"},
		},
		{
			name: "zero replicas", desired: 0,
			want: conds{"Available": "True/MinimumReplicasAvailable", "Progressing": "True/NewReplicasAvailable",
				"Scheduled": "True/NoReplicasRequested"},
			wantReady: "0/0",
		},
		{
			name: "scaling down", desired: 1,
			replicas: []v1alpha1.ModelReplica{replica("a", "h", bound("m1"), ready), replica("b", "h", bound("m2"), ready)},
			want: conds{"Available": "True/MinimumReplicasAvailable", "Progressing": "True/ScalingReplicas",
				"Scheduled": "True/AllReplicasScheduled"},
			wantReady: "2/1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := deployment(nil)
			md.Generation = 3
			in := tt.in
			in.Desired, in.Now = tt.desired, now
			if in.EstimateErr == nil {
				in.Reservation = &q
			}
			setStatus(md, summarize(tt.replicas, byHash("h")), in)
			got := conds{}
			for _, c := range md.Status.Conditions {
				got[c.Type] = string(c.Status) + "/" + c.Reason
				if c.ObservedGeneration != 3 || !c.LastTransitionTime.Time.Equal(now) {
					t.Errorf("%s: observedGeneration %d, lastTransitionTime %v", c.Type, c.ObservedGeneration, c.LastTransitionTime)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("conditions mismatch (-want +got):\n%s", diff)
			}
			if md.Status.Ready != tt.wantReady {
				t.Errorf("ready = %q, want %q", md.Status.Ready, tt.wantReady)
			}
			for typ, sub := range tt.wantMsg {
				if c := meta.FindStatusCondition(md.Status.Conditions, typ); c == nil || !strings.Contains(c.Message, sub) {
					t.Errorf("%s message %q does not contain %q", typ, c.Message, sub)
				}
			}
			if (md.Status.EstimatedMemory == nil) != (in.Reservation == nil) {
				t.Errorf("estimatedMemory = %v with reservation %v", md.Status.EstimatedMemory, in.Reservation)
			}
		})
	}
}

func TestSetStatusFields(t *testing.T) {
	md := deployment(nil)
	q := resource.MustParse("422Mi")
	reps := []v1alpha1.ModelReplica{
		replica("a", "h", bound("mac-b"), ready, memory("3Gi", "2Gi")),
		replica("b", "old", bound("mac-a"), ready, memory("", "4Gi")),
	}
	now := metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	setStatus(md, summarize(reps, byHash("h")), statusInput{Desired: 2, Reservation: &q, Now: now.Time,
		Measured: 4 << 30, FootprintHash: "f00d"})
	four := resource.NewQuantity(4<<30, resource.BinarySI)
	want := v1alpha1.ModelDeploymentStatus{
		Replicas: 2, ReadyReplicas: 2, UpdatedReplicas: 1, Ready: "2/2",
		Selector: "macfleet.dev/deployment=qwen", Nodes: []string{"mac-a", "mac-b"},
		EstimatedMemory: &q, MeasuredMemory: four, MeasuredFootprintHash: "f00d", Endpoint: "http://qwen.team-a.svc:8080",
		Display:          &v1alpha1.MemoryDisplay{Estimated: "422.0 MiB", Measured: "4.0 GiB"},
		LastProgressTime: &now, // a first status is progress
	}
	if diff := cmp.Diff(want, md.Status, cmpopts.IgnoreFields(v1alpha1.ModelDeploymentStatus{}, "Conditions")); diff != "" {
		t.Errorf("status mismatch (-want +got):\n%s", diff)
	}
}

// A condition keeps its lastTransitionTime while its status stays.
func TestSetStatusKeepsTransitionTime(t *testing.T) {
	md := deployment(nil)
	t1 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	reps := []v1alpha1.ModelReplica{replica("a", "h", bound("m"), ready)}
	setStatus(md, summarize(reps, byHash("h")), statusInput{Desired: 1, Now: t1})
	setStatus(md, summarize(reps, byHash("h")), statusInput{Desired: 1, Now: t1.Add(time.Hour)})
	if c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAvailable); !c.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("lastTransitionTime moved to %v", c.LastTransitionTime)
	}
	setStatus(md, summarize(nil, byHash("h")), statusInput{Desired: 1, Now: t1.Add(2 * time.Hour)})
	if c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAvailable); c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Time.Equal(t1.Add(2*time.Hour)) {
		t.Errorf("after losing the replica: %+v", c)
	}
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", maxMessageLength)
	got := truncate(long)
	if len(got) > maxMessageLength || !strings.HasSuffix(got, "...") || !strings.HasPrefix(got, "éé") {
		t.Errorf("truncate: len %d, suffix %q", len(got), got[len(got)-5:])
	}
	if truncate("short") != "short" {
		t.Error("truncate changed a short message")
	}
}

// TestProgressDeadline: on a fake clock, a deployment that makes no progress while it
// has some to make turns Progressing False with ProgressDeadlineExceeded once
// progressDeadlineSeconds passed, naming what holds it up; progress of any kind
// restarts the count; a complete deployment never exceeds it.
func TestProgressDeadline(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const deadline = 10 * time.Minute
	q := resource.MustParse("422Mi")
	pending := []v1alpha1.ModelReplica{replica("a", "h", bound("m1"))}
	failingOne := []v1alpha1.ModelReplica{replica("a", "h", bound("m1"), failing(v1alpha1.ReplicaDownloaded,
		v1alpha1.ReasonDownloadFailed, "checksum mismatch: got sha256:00, want sha256:ff"))}
	readyOne := []v1alpha1.ModelReplica{replica("a", "h", bound("m1"), ready)}
	type step struct {
		after    time.Duration // since t0
		replicas []v1alpha1.ModelReplica
		desired  int32
		want     string // Progressing "Status/Reason"
		msg      string
		left     time.Duration // progressLeft, when it applies (-1: it does not)
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"stuck on a failing replica", []step{
			{0, pending, 1, "True/ScalingReplicas", "1 replicas, 1 wanted, 0 ready", deadline},
			{9 * time.Minute, failingOne, 1, "True/ScalingReplicas", "", time.Minute},
			{deadline, failingOne, 1, "False/ProgressDeadlineExceeded",
				"no progress since 2026-03-01T12:00:00Z (progressDeadlineSeconds 600): 1 replicas, 1 wanted, 0 ready; " +
					"replica a is failing: DownloadFailed: checksum mismatch", 0},
			// It comes good: progress, and the condition with it.
			{deadline + time.Minute, readyOne, 1, "True/NewReplicasAvailable", "all 1 replicas updated and ready", -1},
		}},
		{"progress restarts the count", []step{
			{0, nil, 2, "True/ScalingReplicas", "", deadline},
			{8 * time.Minute, pending, 2, "True/ScalingReplicas", "", deadline},
			{17 * time.Minute, pending, 2, "True/ScalingReplicas", "", time.Minute},
			{18 * time.Minute, pending, 2, "False/ProgressDeadlineExceeded", "no progress since 2026-03-01T12:08:00Z", 0},
		}},
		{"complete, however long", []step{
			{0, readyOne, 1, "True/NewReplicasAvailable", "", -1},
			{24 * time.Hour, readyOne, 1, "True/NewReplicasAvailable", "", -1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := deployment(nil)
			md.Generation = 1
			for i, st := range tc.steps {
				now := t0.Add(st.after)
				setStatus(md, summarize(st.replicas, byHash("h")), statusInput{Desired: st.desired, Reservation: &q, Now: now,
					ProgressDeadline: deadline})
				md.Status.ObservedGeneration = md.Generation
				c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentProgressing)
				if got := string(c.Status) + "/" + c.Reason; got != st.want || !strings.Contains(c.Message, st.msg) {
					t.Errorf("step %d (+%v): Progressing %s %q, want %s with %q", i, st.after, got, c.Message, st.want, st.msg)
				}
				left, ok := progressLeft(md, deadline, now)
				if st.left < 0 && ok || st.left >= 0 && (!ok || left != st.left) {
					t.Errorf("step %d (+%v): progressLeft = %v, %v; want %v", i, st.after, left, ok, st.left)
				}
			}
		})
	}
}

func TestFailureEvent(t *testing.T) {
	failure := func(status metav1.ConditionStatus, reason string) []metav1.Condition {
		return []metav1.Condition{
			{Type: v1alpha1.DeploymentAvailable, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonMinimumReplicasUnavailable},
			{Type: v1alpha1.DeploymentReplicaFailure, Status: status, Reason: reason, Message: "msg of " + reason},
		}
	}
	none := []metav1.Condition{{Type: v1alpha1.DeploymentAvailable, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonMinimumReplicasAvailable}}
	tests := []struct {
		name          string
		before, after []metav1.Condition
		wantReason    string // "": no Event
	}{
		{name: "no failure", before: none, after: none},
		{name: "a failure appears", before: none, after: failure(metav1.ConditionTrue, v1alpha1.ReasonQuotaExceeded),
			wantReason: v1alpha1.ReasonQuotaExceeded},
		{name: "the same failure again", before: failure(metav1.ConditionTrue, v1alpha1.ReasonQuotaExceeded),
			after: failure(metav1.ConditionTrue, v1alpha1.ReasonQuotaExceeded)},
		{name: "another failure", before: failure(metav1.ConditionTrue, v1alpha1.ReasonQuotaExceeded),
			after: failure(metav1.ConditionTrue, v1alpha1.ReasonChecksumMismatch), wantReason: v1alpha1.ReasonChecksumMismatch},
		{name: "the failure is gone", before: failure(metav1.ConditionTrue, v1alpha1.ReasonQuotaExceeded), after: none},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, note, ok := failureEvent(tt.before, tt.after)
			if ok != (tt.wantReason != "") || reason != tt.wantReason {
				t.Fatalf("failureEvent = %q, %q, %v; want reason %q", reason, note, ok, tt.wantReason)
			}
			if ok && note != "msg of "+reason {
				t.Errorf("note %q, want the condition's message", note)
			}
		})
	}
}
