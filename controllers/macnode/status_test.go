package macnode

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
