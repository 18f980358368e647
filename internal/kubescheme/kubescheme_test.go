package kubescheme

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

func TestNewKnowsClientGoAndMacfleetTypes(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{
		&corev1.Secret{}, &coordinationv1.Lease{},
		&mfv1.ModelDeployment{}, &mfv1.ModelReplica{}, &mfv1.MacNode{},
	} {
		if _, _, err := s.ObjectKinds(obj); err != nil {
			t.Errorf("%T: %v", obj, err)
		}
	}
}

func TestNewIsFreshEachCall(t *testing.T) {
	a, errA := New()
	b, errB := New()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a == b {
		t.Error("New returned the same scheme twice; callers may add types to their own")
	}
}
