package clustermode

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

func testReplica(res v1alpha1.Residency) *v1alpha1.ModelReplica {
	return &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", Generation: 3},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:          v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "file:///m.gguf"}, Residency: res},
			TemplateHash:      "h1",
			MemoryReservation: resource.MustParse("64Mi"),
			NodeName:          "mac",
		},
	}
}

// condSummary is "Type=Status/Reason" per owned condition, in order.
func condSummary(st v1alpha1.ModelReplicaStatus) []string {
	var out []string
	for _, c := range st.Conditions {
		out = append(out, c.Type+"="+string(c.Status)+"/"+c.Reason)
	}
	return out
}

func TestOwnedStatus(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	downloaded := &localView{phase: phaseRegistered, hash: "h1", done: 100, total: 100, path: "/store/m.gguf"}
	tests := []struct {
		name      string
		res       v1alpha1.Residency
		local     *localView
		model     *enginepool.ModelSnapshot
		wantPhase v1alpha1.ReplicaPhase
		wantConds []string
		// msg is a substring of the first condition that is not True.
		msg          string
		wantResident int64
		// drain sets spec.drain; notServing: the agent has no serving certificate yet.
		drain, notServing bool
	}{
		{name: "nothing yet", res: v1alpha1.ResidencyResident, wantPhase: v1alpha1.ReplicaPending,
			wantConds: []string{"Downloaded=False/Downloading", "Loaded=False/Downloading", "Ready=False/Downloading"}},
		{name: "downloading", res: v1alpha1.ResidencyResident,
			local:     &localView{phase: phaseDownloading, hash: "h1", done: 25, total: 100},
			wantPhase: v1alpha1.ReplicaDownloading,
			wantConds: []string{"Downloaded=False/Downloading", "Loaded=False/Downloading", "Ready=False/Downloading"},
			msg:       "25%"},
		{name: "checksum mismatch", res: v1alpha1.ResidencyResident,
			local: &localView{phase: phaseDownloadFailed, hash: "h1", fetchErr: errors.New("sha256 abc, want def"),
				fetchReason: v1alpha1.ReasonChecksumMismatch, retryAt: now.Add(4 * time.Second)},
			wantPhase: v1alpha1.ReplicaFailed,
			wantConds: []string{"Downloaded=False/ChecksumMismatch", "Loaded=False/ChecksumMismatch", "Ready=False/ChecksumMismatch"},
			msg:       "retrying at 2026-01-02T03:04:09Z"},
		{name: "retrying after a checksum mismatch", res: v1alpha1.ResidencyResident,
			local: &localView{phase: phaseDownloading, hash: "h1", done: 25, total: 100, fetchErr: errors.New("sha256 abc, want def"),
				fetchReason: v1alpha1.ReasonChecksumMismatch},
			wantPhase: v1alpha1.ReplicaDownloading,
			wantConds: []string{"Downloaded=False/ChecksumMismatch", "Loaded=False/Downloading", "Ready=False/Downloading"},
			msg:       "retrying (downloading file:///m.gguf: 25"},
		{name: "resident loaded", res: v1alpha1.ResidencyResident, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateReady, PID: 42, ResidentBytes: 50 << 20, PeakBytes: 60 << 20},
			wantPhase: v1alpha1.ReplicaRunning, wantResident: 50 << 20,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=True/RunnerReady", "Ready=True/RunnerReady"}},
		// While the agent cannot answer, a replica that would be Ready is not; the
		// message names the Mac and the fix. Other states stay as they are.
		{name: "resident loaded, the agent not serving yet", res: v1alpha1.ResidencyResident, local: downloaded, notServing: true,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateReady, PID: 42, ResidentBytes: 50 << 20, PeakBytes: 60 << 20},
			wantPhase: v1alpha1.ReplicaPending, wantResident: 50 << 20,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=True/RunnerReady", "Ready=False/AgentNotServing"},
			msg:       "the agent on mac has no serving certificate yet"},
		{name: "on demand stored, the agent not serving yet", res: v1alpha1.ResidencyOnDemand, local: downloaded, notServing: true,
			wantPhase: v1alpha1.ReplicaPending,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/Unloaded", "Ready=False/AgentNotServing"},
			msg:       "kubectl get csr"},
		{name: "resident loading, the agent not serving yet", res: v1alpha1.ResidencyResident, local: downloaded, notServing: true,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateLoading},
			wantPhase: v1alpha1.ReplicaLoading,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/Loading", "Ready=False/Loading"}},
		{name: "resident loading", res: v1alpha1.ResidencyPinned, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateLoading},
			wantPhase: v1alpha1.ReplicaLoading,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/Loading", "Ready=False/Loading"}},
		{name: "on demand standby", res: v1alpha1.ResidencyOnDemand, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateAbsent},
			wantPhase: v1alpha1.ReplicaStandby,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/Unloaded", "Ready=True/WaitingForDemand"}},
		{name: "load failed", res: v1alpha1.ResidencyResident, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateFailed, LastError: "runner exited with status 1", RetryAt: now.Add(time.Second)},
			wantPhase: v1alpha1.ReplicaFailed,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/LoadFailed", "Ready=False/LoadFailed"},
			msg:       "runner exited with status 1; retrying at"},
		{name: "on demand load failed, in the backoff", res: v1alpha1.ResidencyOnDemand, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateFailed, LastError: "runner exited: signal killed", RetryAt: now.Add(time.Second)},
			wantPhase: v1alpha1.ReplicaFailed,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/LoadFailed", "Ready=False/LoadFailed"},
			msg:       "signal killed; retrying at"},
		// Ready once the backoff is over: the next request loads it, and the gateway only
		// sends requests to Ready replicas (the soak found one stuck Failed for good).
		{name: "on demand load failed, backoff over", res: v1alpha1.ResidencyOnDemand, local: downloaded,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateFailed, LastError: "runner exited: signal killed", RetryAt: now},
			wantPhase: v1alpha1.ReplicaStandby,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/LoadFailed", "Ready=True/WaitingForDemand"},
			msg:       "signal killed; the next request loads it again"},
		{name: "eager load refused", res: v1alpha1.ResidencyResident,
			local: &localView{phase: phaseRegistered, hash: "h1", path: "/store/m.gguf",
				loadErr: errors.New("needs 8.0 GiB but the pool ceiling is 4.0 GiB"), loadRetryAt: now.Add(2 * time.Second)},
			model:     &enginepool.ModelSnapshot{State: enginepool.StateAbsent},
			wantPhase: v1alpha1.ReplicaFailed,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/LoadFailed", "Ready=False/LoadFailed"},
			msg:       "pool ceiling is 4.0 GiB; retrying at 2026-01-02T03:04:07Z"},
		{name: "removing", res: v1alpha1.ResidencyOnDemand,
			local:     &localView{phase: phaseRemoving, hash: "h1", path: "/store/m.gguf"},
			model:     &enginepool.ModelSnapshot{State: enginepool.StateDraining},
			wantPhase: v1alpha1.ReplicaDraining,
			wantConds: []string{"Downloaded=True/Stored", "Loaded=False/Draining", "Ready=False/Draining"}},

		// The deployment controller removes the replica (spec.drain).
		{name: "drain: the engine still serves its requests", res: v1alpha1.ResidencyResident, local: downloaded, drain: true,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateDraining, ResidentBytes: 50 << 20},
			wantPhase: v1alpha1.ReplicaDraining, wantResident: 50 << 20,
			wantConds: []string{"Loaded=False/Draining", "Ready=False/Draining"}, msg: "finishing the requests in flight"},
		{name: "drain: just set on a loaded engine", res: v1alpha1.ResidencyOnDemand, local: downloaded, drain: true,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateReady, ResidentBytes: 50 << 20},
			wantPhase: v1alpha1.ReplicaDraining, wantResident: 50 << 20,
			wantConds: []string{"Loaded=False/Draining", "Ready=False/Draining"}},
		{name: "drained: unloaded and measured", res: v1alpha1.ResidencyResident, local: downloaded, drain: true,
			model: &enginepool.ModelSnapshot{State: enginepool.StateUnloaded, Retired: true,
				LastUnload: &enginepool.UnloadReport{Reason: enginepool.ReasonRetired, FreedBytes: 40 << 20, ResidentBytes: 50 << 20, Outcome: enginepool.Settled}},
			wantPhase: v1alpha1.ReplicaDraining,
			wantConds: []string{"Loaded=False/Drained", "Ready=False/Draining"}, msg: "unloaded (Drained, 40.0 MiB freed)"},
		{name: "drained: on demand, never loaded", res: v1alpha1.ResidencyOnDemand, local: downloaded, drain: true,
			model:     &enginepool.ModelSnapshot{State: enginepool.StateAbsent, Retired: true},
			wantPhase: v1alpha1.ReplicaDraining,
			wantConds: []string{"Loaded=False/Drained", "Ready=False/Draining"}, msg: "not in memory"},
		{name: "drained: nothing on this node", res: v1alpha1.ResidencyResident, drain: true,
			wantPhase: v1alpha1.ReplicaDraining,
			wantConds: []string{"Loaded=False/Drained", "Ready=False/Draining"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mr := testReplica(tt.res)
			if tt.drain {
				mr.Spec.Drain = &metav1.Time{Time: now}
			}
			st := ownedStatus(mr, tt.local, tt.model, "10.0.0.5:8080", now)
			if tt.notServing {
				notServing(&st, "mac")
			}
			if st.Phase != tt.wantPhase {
				t.Errorf("phase %s, want %s", st.Phase, tt.wantPhase)
			}
			if d := cmp.Diff(tt.wantConds, condSummary(st)); d != "" {
				t.Errorf("conditions (-want +got):\n%s", d)
			}
			for _, c := range st.Conditions {
				if c.ObservedGeneration != 3 {
					t.Errorf("%s: observedGeneration %d, want 3", c.Type, c.ObservedGeneration)
				}
				if c.Message == "" {
					t.Errorf("%s: empty message", c.Type)
				}
			}
			if tt.msg != "" {
				found := false
				for _, c := range st.Conditions {
					found = found || (c.Status != metav1.ConditionTrue && strings.Contains(c.Message, tt.msg))
				}
				if !found {
					t.Errorf("no condition message mentions %q: %+v", tt.msg, st.Conditions)
				}
			}
			if st.Endpoint != "10.0.0.5:8080" {
				t.Errorf("endpoint %q", st.Endpoint)
			}
			if st.Memory.Estimated == nil || st.Memory.Estimated.Value() != 64<<20 {
				t.Errorf("estimated %v, want the reservation 64Mi", st.Memory.Estimated)
			}
			var resident int64
			if st.Memory.Resident != nil {
				resident = st.Memory.Resident.Value()
			}
			if resident != tt.wantResident {
				t.Errorf("resident %d, want %d", resident, tt.wantResident)
			}
			if tt.local != nil && st.ObservedTemplateHash != "h1" {
				t.Errorf("observedTemplateHash %q, want h1", st.ObservedTemplateHash)
			}
		})
	}
}

func TestUnloadReport(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	tests := []struct {
		in   enginepool.UnloadReport
		want v1alpha1.UnloadReport
	}{
		{in: enginepool.UnloadReport{Reason: enginepool.ReasonIdle, FreedBytes: 10, ResidentBytes: 12, Outcome: enginepool.Settled,
			Duration: time.Second, Time: at},
			want: v1alpha1.UnloadReport{Reason: "Idle", FreedBytes: 10, ResidentBytes: 12, Outcome: v1alpha1.UnloadSettled,
				Duration: metav1.Duration{Duration: time.Second}, Time: metav1.NewTime(at.Truncate(time.Second))}},
		{in: enginepool.UnloadReport{Reason: enginepool.ReasonRemoved, FreedBytes: -5, Outcome: "weird", Time: at},
			want: v1alpha1.UnloadReport{Reason: "Deleted", Outcome: v1alpha1.UnloadIndeterminate,
				Time: metav1.NewTime(at.Truncate(time.Second))}},
	}
	for _, tt := range tests {
		if d := cmp.Diff(&tt.want, unloadReport(tt.in)); d != "" {
			t.Errorf("unloadReport(%+v) (-want +got):\n%s", tt.in, d)
		}
	}
}

// TestApplyOwnedKeepsOthers: the scheduler's condition and the transition times of
// unchanged conditions survive the agent's writes.
func TestApplyOwnedKeepsOthers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Hour)
	st := v1alpha1.ModelReplicaStatus{Conditions: []metav1.Condition{
		{Type: v1alpha1.ReplicaScheduled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBound, LastTransitionTime: metav1.NewTime(t0)},
		{Type: v1alpha1.ReplicaDownloaded, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonStored, Message: "stored at /a",
			LastTransitionTime: metav1.NewTime(t0)},
		{Type: v1alpha1.ReplicaReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonLoading, LastTransitionTime: metav1.NewTime(t0)},
	}}
	owned := ownedStatus(testReplica(v1alpha1.ResidencyResident), &localView{phase: phaseRegistered, hash: "h1", path: "/a"},
		&enginepool.ModelSnapshot{State: enginepool.StateReady, ResidentBytes: 1 << 20}, "e:1", t1)
	applyOwned(&st, owned, t1)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaScheduled); c == nil || c.Reason != v1alpha1.ReasonBound {
		t.Errorf("Scheduled condition lost: %+v", st.Conditions)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaDownloaded); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Downloaded transition time moved to %s though its status did not change", c.LastTransitionTime)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaReady); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("Ready = %+v, want True since %s", c, t1)
	}
	if want := (&v1alpha1.MemoryDisplay{Reserved: "64.0 MiB", Resident: "1.0 MiB"}); !cmp.Equal(st.Display, want) {
		t.Errorf("display %+v, want %+v", st.Display, want)
	}
	if st.Phase != v1alpha1.ReplicaRunning || st.Endpoint != "e:1" {
		t.Errorf("phase %s endpoint %s", st.Phase, st.Endpoint)
	}
}

// A model whose chat template the runner refused at load (a template nested beyond
// the parser's limit, or one that does not parse) is Loaded, and the condition says
// that prompts are rendered with llama.cpp's templates instead, and why.
func TestLoadedMessageNamesARefusedTemplate(t *testing.T) {
	for _, tc := range []struct {
		name string
		chat *runnerapi.ChatInfo
		want string
	}{
		{"own template", &runnerapi.ChatInfo{Renderer: runnerapi.RendererJinja}, "runner pid 42 holds the model (50.0 MiB resident)"},
		{"no chat info", nil, "runner pid 42 holds the model (50.0 MiB resident)"},
		{"refused", &runnerapi.ChatInfo{Renderer: runnerapi.RendererBuiltin, TemplateError: "template syntax error at line 1: blocks or expressions nested deeper than 256"},
			"runner pid 42 holds the model (50.0 MiB resident); the model's chat template is not used (template syntax error at line 1: blocks or expressions nested deeper than 256): prompts are rendered with llama.cpp's built-in templates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := loadedMessage(&enginepool.ModelSnapshot{State: enginepool.StateReady, PID: 42, ResidentBytes: 50 << 20, Chat: tc.chat})
			if got != tc.want {
				t.Errorf("loadedMessage = %q, want %q", got, tc.want)
			}
		})
	}
}

// The paths the runner serves the model without are in the replica's status with
// their reasons, loaded or unloaded (the pool keeps the runner's last report); a path
// the API does not name is left out, and a model that serves every path has none.
func TestOwnedStatusNamesThePathsOff(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	local := &localView{phase: phaseRegistered, hash: "h1", done: 100, total: 100, path: "/store/m.gguf"}
	reason := "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (qwen3next)"
	want := []v1alpha1.PathOff{{Path: v1alpha1.ServingPathPromptCache, Reason: reason}}
	for _, tc := range []struct {
		name  string
		model enginepool.ModelSnapshot
		want  []v1alpha1.PathOff
	}{
		{"serves every path", enginepool.ModelSnapshot{State: enginepool.StateReady}, nil},
		{"loaded without its prompt cache", enginepool.ModelSnapshot{State: enginepool.StateReady,
			Off: []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: reason}}}, want},
		{"unloaded, as its runner last reported", enginepool.ModelSnapshot{State: enginepool.StateUnloaded,
			Off: []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: reason}}}, want},
		{"a path the API does not name", enginepool.ModelSnapshot{State: enginepool.StateReady,
			Off: []runnerapi.PathOff{{Path: "future_path", Reason: "off"}}}, nil},
		{"a reason cut to the API's bound", enginepool.ModelSnapshot{State: enginepool.StateReady,
			Off: []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: strings.Repeat("x", 2000)}}},
			[]v1alpha1.PathOff{{Path: v1alpha1.ServingPathPromptCache, Reason: strings.Repeat("x", 1021) + "..."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owned := ownedStatus(testReplica(v1alpha1.ResidencyOnDemand), local, &tc.model, "mac:8443", now)
			if d := cmp.Diff(tc.want, owned.PathsOff); d != "" {
				t.Fatalf("owned pathsOff (-want +got):\n%s", d)
			}
			// The agent owns the field: its report replaces what the status held.
			st := v1alpha1.ModelReplicaStatus{PathsOff: want}
			applyOwned(&st, owned, now)
			if d := cmp.Diff(tc.want, st.PathsOff); d != "" {
				t.Fatalf("applied pathsOff (-want +got):\n%s", d)
			}
		})
	}
}
