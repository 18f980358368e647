package autoscaler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func autoscaled(name string, as v1alpha1.AutoscalingSpec) *v1alpha1.ModelDeployment {
	return &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model:       v1alpha1.ModelSource{Source: "hf://org/repo/model.gguf"},
			Autoscaling: &as,
		},
	}
}

func writes(f *fixture, name string) float64 {
	l := f.ns + "/" + name
	return testutil.ToFloat64(apiWrites.WithLabelValues(l, "spec")) + testutil.ToFloat64(apiWrites.WithLabelValues(l, "status"))
}

// waitScaled waits until the deployment has n replicas and an Event says why, and
// returns it. (The condition tells the scale's reason only until the next
// measurement: then it says why the replicas stay.)
func (f *fixture) waitScaled(name string, n int32, reason, note string) *v1alpha1.ModelDeployment {
	f.t.Helper()
	var md *v1alpha1.ModelDeployment
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		md = f.get(name)
		got := ptr.Deref(md.Spec.Replicas, -1)
		return got == n, fmt.Sprintf("%d replicas, want %d", got, n)
	})
	f.waitEvent(name, reason, note)
	return md
}

// waitEvent waits for an Event about the deployment with the reason and a note
// containing note.
func (f *fixture) waitEvent(name, reason, note string) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		var list eventsv1.EventList
		if err := f.e.Client.List(f.t.Context(), &list, client.InNamespace(f.ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == name && ev.Reason == reason && strings.Contains(ev.Note, note) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Note)
		}
		return false, fmt.Sprintf("no %s Event with %q among %q", reason, note, seen)
	})
}

// TestAutoscalerFollowsLoad runs the controller against the API server with a fake
// load source and a fake clock: load rises → replicas rise after the stabilization
// window; beyond maxReplicas they stop at max; load falls → replicas fall after
// scaleDownDelay to what the highest load of the delay needs; each scale is an Event
// and the condition says why; steady load costs no API write.
func TestAutoscalerFollowsLoad(t *testing.T) {
	f := start(t)
	const name = "chat"
	f.create(autoscaled(name, v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 4, TargetInFlight: ptr.To[int32](2),
		StabilizationWindow: &metav1.Duration{Duration: 30 * time.Second}, ScaleDownDelay: &metav1.Duration{Duration: 2 * time.Minute}}))

	md := f.waitFor(name, 1, v1alpha1.ReasonWithinTarget,
		"the autoscaler owns spec.replicas (1 to 4 replicas, target 2 requests in flight each): 1 replicas, the minimum")
	if c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAutoscaling); c.Status != metav1.ConditionTrue {
		t.Errorf("Autoscaling condition %s, want True", c.Status)
	}

	// A step to 6 in flight: held back for the window, then 3 replicas.
	f.tick(name, 10*time.Second, Load{InFlight: 6})
	f.waitFor(name, 1, v1alpha1.ReasonScaleUpStabilizing,
		"the load has needed more than 1 replicas since 2026-11-22T12:00:10Z with no break over 30s; scaling up once it has for a whole stabilizationWindow (30s)")
	for range 2 {
		f.tick(name, 10*time.Second, Load{InFlight: 6})
	}
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 1 {
		t.Fatalf("scaled to %d before the window passed", *md.Spec.Replicas)
	}
	f.tick(name, 10*time.Second, Load{InFlight: 6})
	f.waitScaled(name, 3, v1alpha1.ReasonScaledUp, "scaled up from 1 to 3: at least 6 requests in flight for 30s, target 2 per replica")
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		st := f.get(name).Status.Autoscaling
		return st != nil && st.RecommendedReplicas == 3 && st.LastScaleTime != nil && st.LastScaleTime.Time.Equal(f.clk.Now()),
			fmt.Sprintf("status.autoscaling = %+v, want 3 replicas recommended, last scale at %s", st, f.clk.Now())
	})

	// Far more than max: 4 replicas, then AtMaxReplicas.
	for range 4 {
		f.tick(name, 10*time.Second, Load{InFlight: 40})
	}
	f.waitFor(name, 4, v1alpha1.ReasonAtMaxReplicas, "the load needs more than maxReplicas (4 replicas")
	f.waitEvent(name, v1alpha1.ReasonScaledUp, "scaled up from 3 to 4: at least 40 requests in flight for 30s, target 2 per replica; the load needs 20, maxReplicas is 4")

	// Load falls to 3: replicas stay for the delay, then 2.
	f.tick(name, 10*time.Second, Load{InFlight: 3})
	f.waitFor(name, 4, v1alpha1.ReasonScaleDownDelayed, "the load has fitted fewer than 4 replicas since 2026-11-22T12:01:30Z with no break over 30s; "+
		"scaling down once it has for a whole scaleDownDelay (2m0s)")
	for range 11 {
		f.tick(name, 10*time.Second, Load{InFlight: 3})
	}
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 4 {
		t.Fatalf("scaled to %d before scaleDownDelay passed", *md.Spec.Replicas)
	}
	f.tick(name, 10*time.Second, Load{InFlight: 3})
	f.waitScaled(name, 2, v1alpha1.ReasonScaledDown, "scaled down from 4 to 2: at most 3 requests in flight for 2m0s, target 2 per replica")

	// Steady load: no write at all, however many measurements.
	f.tick(name, 10*time.Second, Load{InFlight: 4})
	f.waitFor(name, 2, v1alpha1.ReasonWithinTarget, "2 replicas for the load at target 2 requests in flight each")
	before := writes(f, name)
	for range 10 {
		f.tick(name, 10*time.Second, Load{InFlight: 4})
	}
	if after := writes(f, name); after != before {
		t.Errorf("steady load wrote %v times to the API server over 10 measurements, want 0", after-before)
	}
}

// TestAutoscalerScaleToZeroAndLimits: with minReplicas 0 a deployment reaches zero
// after scaleDownDelay without a request and comes back at once for held requests;
// a replica count set through the scale subresource outside min..max is brought back.
func TestAutoscalerScaleToZeroAndLimits(t *testing.T) {
	f := start(t)
	const name = "idle"
	md := autoscaled(name, v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2, TargetInFlight: ptr.To[int32](1),
		StabilizationWindow: &metav1.Duration{}, ScaleDownDelay: &metav1.Duration{Duration: time.Minute}})
	md.Spec.Replicas = ptr.To[int32](2)
	f.create(md)

	f.waitFor(name, 2, v1alpha1.ReasonScaleDownDelayed, "since 2026-11-22T12:00:00Z with no break over 30s; scaling down once it has for a whole scaleDownDelay (1m0s)")
	for range 5 {
		f.tick(name, 10*time.Second, Load{})
	}
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 2 {
		t.Fatalf("scaled to %d before scaleDownDelay passed", *md.Spec.Replicas)
	}
	f.tick(name, 10*time.Second, Load{})
	f.waitScaled(name, 0, v1alpha1.ReasonScaledDown, "scaled down from 2 to 0: at most 0 requests in flight for 1m0s")
	f.tick(name, 10*time.Second, Load{})
	f.waitFor(name, 0, v1alpha1.ReasonWithinTarget, "0 replicas: no request in flight (minReplicas is 0)")

	f.tick(name, 10*time.Second, Load{Held: 2})
	f.waitScaled(name, 2, v1alpha1.ReasonScaledUp, "scaled up from 0 to 2: 2 requests arrived with no replica")

	// Someone scales to 5 through the scale subresource: back to max.
	// (The autoscaler may write between the read and the update: read again then.)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := f.get(name)
		scale := &autoscalingv1.Scale{}
		if err := f.e.Client.SubResource("scale").Get(t.Context(), cur, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = 5
		return f.e.Client.SubResource("scale").Update(t.Context(), cur, client.WithSubResourceBody(scale))
	}); err != nil {
		t.Fatalf("scaling to 5: %v", err)
	}
	f.waitScaled(name, 2, v1alpha1.ReasonOutsideLimits, "scaled down from 5 to 2: spec.replicas was above maxReplicas")
}

// TestAutoscalerLoadUnknown: when the source fails the replicas stay and, once the
// last measurement is stale, the condition is Unknown with the source's error.
func TestAutoscalerLoadUnknown(t *testing.T) {
	f := start(t)
	const name = "dark"
	md := autoscaled(name, v1alpha1.AutoscalingSpec{MaxReplicas: 3})
	md.Spec.Replicas = ptr.To[int32](2)
	f.create(md)
	f.tick(name, 10*time.Second, Load{InFlight: 2})
	f.waitFor(name, 2, v1alpha1.ReasonWithinTarget, "")

	f.src.set(name, Load{}, errors.New("agent of mac-a unreachable"))
	f.clk.Step(2 * time.Minute)
	md = f.waitFor(name, 2, v1alpha1.ReasonLoadUnknown,
		"no load measurement since 2026-11-22T12:00:10Z; keeping 2 replicas: agent of mac-a unreachable")
	if c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAutoscaling); c.Status != metav1.ConditionUnknown {
		t.Errorf("Autoscaling condition %s, want Unknown", c.Status)
	}
}

// TestAutoscalerLetsGo: removing spec.autoscaling removes what the autoscaler wrote in
// status and leaves spec.replicas to the user.
func TestAutoscalerLetsGo(t *testing.T) {
	f := start(t)
	const name = "manual"
	f.create(autoscaled(name, v1alpha1.AutoscalingSpec{MaxReplicas: 3}))
	f.tick(name, 10*time.Second, Load{})
	f.waitFor(name, 1, v1alpha1.ReasonWithinTarget, "")

	testenv.Eventually(t, wait, poll, func() (bool, string) {
		md := f.get(name)
		md.Spec.Autoscaling, md.Spec.Replicas = nil, ptr.To[int32](3)
		if err := f.e.Client.Update(t.Context(), md); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		md := f.get(name)
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAutoscaling)
		return c == nil && md.Status.Autoscaling == nil, fmt.Sprintf("condition %v, status.autoscaling %+v", c, md.Status.Autoscaling)
	})
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 3 {
		t.Errorf("spec.replicas = %d after autoscaling was removed, want the user's 3", *md.Spec.Replicas)
	}
}

// TestAutoscalerWakeFromZero: a gateway's wake annotation on a deployment at zero
// replicas counts as a held request: one replica at once, kept while the wake is
// renewed and for a whole scaleDownDelay after it stops, then zero again.
func TestAutoscalerWakeFromZero(t *testing.T) {
	f := start(t)
	const name = "woken"
	md := autoscaled(name, v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2, TargetInFlight: ptr.To[int32](1),
		ScaleDownDelay: &metav1.Duration{Duration: time.Minute}})
	md.Spec.Replicas = ptr.To[int32](0)
	f.create(md)
	f.tick(name, 10*time.Second, Load{})
	f.waitFor(name, 0, v1alpha1.ReasonWithinTarget, "0 replicas: no request in flight (minReplicas is 0)")

	wake := func() {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationWakeRequested,
			f.clk.Now().Format(time.RFC3339Nano))
		if err := f.e.Client.Patch(t.Context(), f.get(name), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	wake()
	f.waitScaled(name, 1, v1alpha1.ReasonScaledUp, "scaled up from 0 to 1: a request arrived with no replica")

	// The replica loads for 40s while the gateway renews its wake every 10s: the held
	// request keeps it, as the agents report nothing in flight yet.
	for range 4 {
		f.tick(name, v1alpha1.WakeRenewInterval, Load{})
		wake()
	}
	// Then the request is served and no other comes. The last wake counts as a held
	// request for WakeHold (30s), and then the load must fit zero replicas for a whole
	// scaleDownDelay (1m): 90s after the last wake the replica is still there.
	for range 8 {
		f.tick(name, 10*time.Second, Load{})
	}
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 1 {
		t.Fatalf("scaled to %d within WakeHold + scaleDownDelay of the last wake", *md.Spec.Replicas)
	}
	f.tick(name, 10*time.Second, Load{})
	f.waitScaled(name, 0, v1alpha1.ReasonScaledDown, "scaled down from 1 to 0")
}
