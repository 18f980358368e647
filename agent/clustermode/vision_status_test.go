package clustermode

import (
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// The replica's status says vision while its loaded runner reports a projector, and
// not otherwise; the agent's report replaces what the status held.
func TestOwnedStatusSaysVision(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	local := &localView{phase: phaseRegistered, hash: "h1", done: 100, total: 100, path: "/store/m.gguf"}
	for _, tc := range []struct {
		name  string
		model *enginepool.ModelSnapshot
		want  bool
	}{
		{"no pool entry", nil, false},
		{"not loaded", &enginepool.ModelSnapshot{State: enginepool.StateUnloaded}, false},
		{"loaded without a projector", &enginepool.ModelSnapshot{State: enginepool.StateReady, Chat: &runnerapi.ChatInfo{}}, false},
		{"loaded with its projector", &enginepool.ModelSnapshot{State: enginepool.StateReady, Chat: &runnerapi.ChatInfo{Vision: true}}, true},
	} {
		owned := ownedStatus(testReplica(v1alpha1.ResidencyResident), local, tc.model, "mac:8443", now)
		st := v1alpha1.ModelReplicaStatus{Vision: !tc.want}
		applyOwned(&st, owned, now)
		if owned.Vision != tc.want || st.Vision != tc.want {
			t.Errorf("%s: owned vision %v, applied %v; want %v", tc.name, owned.Vision, st.Vision, tc.want)
		}
	}
}
