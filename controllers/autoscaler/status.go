package autoscaler

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// maxMessageLength bounds condition messages (the API allows 32768).
const maxMessageLength = 1024

// setAutoscalingStatus records a recommendation in md's status: status.autoscaling and
// the Autoscaling condition, True when the recommendation rests on a fresh load
// measurement and Unknown otherwise, its message saying that the autoscaler owns
// spec.replicas, within which limits, and why. scaled says the recommendation was
// just written to spec.replicas.
func setAutoscalingStatus(md *v1alpha1.ModelDeployment, p Policy, rec Recommendation, scaled bool, now time.Time) {
	st := md.Status.Autoscaling
	if st == nil {
		st = &v1alpha1.AutoscalingStatus{}
		md.Status.Autoscaling = st
	}
	st.RecommendedReplicas, st.Reason = rec.Replicas, rec.Reason
	if scaled {
		t := metav1.NewTime(now)
		st.LastScaleTime = &t
	}
	status := metav1.ConditionTrue
	if !rec.Known() {
		status = metav1.ConditionUnknown
	}
	msg := fmt.Sprintf("the autoscaler owns spec.replicas (%d to %d replicas, target %d requests in flight each): %s",
		p.Min, p.Max, p.Target, rec.Message)
	meta.SetStatusCondition(&md.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.DeploymentAutoscaling,
		Status:             status,
		ObservedGeneration: md.Generation,
		LastTransitionTime: metav1.NewTime(now),
		Reason:             rec.Reason,
		Message:            truncate(msg),
	})
}

// clearAutoscalingStatus removes what the autoscaler wrote once spec.autoscaling is
// gone: spec.replicas is the user's again.
func clearAutoscalingStatus(md *v1alpha1.ModelDeployment) {
	md.Status.Autoscaling = nil
	meta.RemoveStatusCondition(&md.Status.Conditions, v1alpha1.DeploymentAutoscaling)
}

func truncate(s string) string {
	if len(s) <= maxMessageLength {
		return s
	}
	return strings.ToValidUTF8(s[:maxMessageLength-3], "") + "..."
}
