package autoscaler

import (
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Woken reports whether a gateway holds requests for md at now: its
// AnnotationWakeRequested carries a time within WakeHold of now, either side (the
// gateway's clock may run ahead of the manager's). A missing or unreadable annotation
// is no wake. The time is also returned, zero when there is none.
func Woken(md *v1alpha1.ModelDeployment, now time.Time) (bool, time.Time) {
	v, ok := md.Annotations[v1alpha1.AnnotationWakeRequested]
	if !ok {
		return false, time.Time{}
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return false, time.Time{}
	}
	d := now.Sub(at)
	return d < v1alpha1.WakeHold && d > -v1alpha1.WakeHold, at
}
