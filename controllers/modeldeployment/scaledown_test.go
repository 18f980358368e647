package modeldeployment

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestScaleDownPrefersPressuredMac: of two Ready replicas, scaling down removes the
// one whose Mac reports the higher memory pressure, though it is the older one (age
// alone would remove the newer).
func TestScaleDownPrefersPressuredMac(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	calm, hard := f.macNode("calm", v1alpha1.PressureOK), f.macNode("hard", v1alpha1.PressureHard)

	f.create(newDeployment("m", "http://models.example/m.gguf", 1, "1Gi"))
	older := f.waitReplicas(1)[0]
	f.bind(&older, hard)
	f.markReady(&older)
	// Creation timestamps have one-second resolution: the second replica must be newer.
	testenv.Eventually(t, 3*time.Second, poll, func() (bool, string) {
		return time.Now().Truncate(time.Second).After(older.CreationTimestamp.Time), "same second"
	})
	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](2) })
	var newer v1alpha1.ModelReplica
	for _, r := range f.waitReplicas(2) {
		if r.Name != older.Name {
			newer = r
		}
	}
	f.bind(&newer, calm)
	f.markReady(&newer)
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 2, md.Status.Ready
	})

	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](1) })
	if left := f.waitReplicas(1); left[0].Name != newer.Name {
		t.Errorf("scaling down kept %s on %s, want %s on the calm Mac %s", left[0].Name, left[0].Spec.NodeName, newer.Name, calm)
	}
}

// macNode creates a MacNode named after the test's namespace reporting pressure, and
// deletes it when the test ends.
func (f *fixture) macNode(suffix string, pressure v1alpha1.PressureLevel) string {
	f.t.Helper()
	mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + suffix}}
	if err := f.c.Create(f.t.Context(), mn); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), mn) })
	mn.Status.Memory.Pressure = pressure
	if err := f.c.Status().Update(f.t.Context(), mn); err != nil {
		f.t.Fatalf("reporting pressure %s on %s: %v", pressure, mn.Name, err)
	}
	return mn.Name
}
