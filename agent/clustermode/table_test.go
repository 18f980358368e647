package clustermode

import (
	"testing"
)

// TestTransitionTableIsTotal proves that every (desired, observed) pair has a defined
// action, so no combination of API state and local state leaves a replica stuck.
func TestTransitionTableIsTotal(t *testing.T) {
	for d := Desired(0); d < numDesired; d++ {
		for o := Observed(0); o < numObserved; o++ {
			a := Decide(d, o)
			if a <= actionUndefined || a >= numActions {
				t.Errorf("desired %s × observed %s: no action (%s)", d, o, a)
			}
		}
	}
	if n := len(transitions); n != int(numObserved) {
		t.Errorf("the table has %d rows, want one per observed state (%d)", n, numObserved)
	}
	if got := Decide(numDesired, ObservedLoaded); got != actionUndefined {
		t.Errorf("Decide out of range = %s, want undefined", got)
	}
	for _, s := range []interface{ String() string }{numDesired, numObserved, numActions} {
		if s.String() == "" {
			t.Errorf("empty name for %#v", s)
		}
	}
}

// TestTransitions pins the behaviour that matters most.
func TestTransitions(t *testing.T) {
	tests := []struct {
		d    Desired
		o    Observed
		want Action
	}{
		{DesiredResident, ObservedNotRegistered, ActionFetch},
		{DesiredOnDemand, ObservedDownloaded, ActionRegister},
		{DesiredPinned, ObservedDownloaded, ActionRegisterLoad},
		{DesiredResident, ObservedStandby, ActionLoad},
		{DesiredOnDemand, ObservedStandby, ActionNone},
		{DesiredResident, ObservedLoadFailed, ActionRetryLoad},
		{DesiredOnDemand, ObservedLoadFailed, ActionNone},
		{DesiredResident, ObservedDownloadFailed, ActionRetryFetch},
		{DesiredAbsent, ObservedLoaded, ActionRemove},
		{DesiredAbsent, ObservedDownloading, ActionRemove},
		{DesiredAbsent, ObservedNotRegistered, ActionNone},
		{DesiredChanged, ObservedLoaded, ActionUpdate},
		{DesiredChanged, ObservedDownloading, ActionRemove},
	}
	for _, tt := range tests {
		if got := Decide(tt.d, tt.o); got != tt.want {
			t.Errorf("Decide(%s, %s) = %s, want %s", tt.d, tt.o, got, tt.want)
		}
	}
}

// TestDrainedColumn: a replica being removed (spec.drain) is never fetched, loaded,
// registered or updated from any local state, and every state with a pool entry
// retires it, so a late request cannot load it again and its unload is reported.
func TestDrainedColumn(t *testing.T) {
	loads := map[Action]bool{ActionFetch: true, ActionRetryFetch: true, ActionRegisterLoad: true, ActionRegister: true,
		ActionLoad: true, ActionRetryLoad: true, ActionUpdate: true}
	inPool := map[Observed]bool{ObservedStandby: true, ObservedLoading: true, ObservedLoaded: true,
		ObservedLoadFailed: true, ObservedUnloading: true}
	for o := Observed(0); o < numObserved; o++ {
		a := Decide(DesiredDrained, o)
		if loads[a] {
			t.Errorf("Decide(Drained, %s) = %s: a drained replica must not be fetched or loaded", o, a)
		}
		if inPool[o] && a != ActionRetire {
			t.Errorf("Decide(Drained, %s) = %s, want %s: the pool entry must refuse requests", o, a, ActionRetire)
		}
	}
	if got := Decide(DesiredDrained, ObservedDownloading); got != ActionRemove {
		t.Errorf("Decide(Drained, Downloading) = %s, want the download canceled (%s)", got, ActionRemove)
	}
}
