package clustermode

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// errReader answers every Get with err, or with a replica of UID uid when err is nil.
// The writer tells its readers apart by comparison, so they are pointers.
type errReader struct {
	err error
	uid types.UID
}

func (r *errReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if r.err != nil {
		return r.err
	}
	mr := obj.(*v1alpha1.ModelReplica)
	mr.Namespace, mr.Name, mr.UID = key.Namespace, key.Name, r.uid
	return nil
}

func (*errReader) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// TestStatusWriterGoneReplica: a replica the informer lost and the API server no
// longer lets this node read (403 from the node authorizer, as 404 without it) is
// gone, and its pending status is dropped; a 403 while the informer still has the
// replica is an error, retried.
func TestStatusWriterGoneReplica(t *testing.T) {
	gr := v1alpha1.GroupVersion.WithResource("modelreplicas").GroupResource()
	notFound, forbidden := apierrors.NewNotFound(gr, "r"), apierrors.NewForbidden(gr, "r", nil)
	u := statusUpdate{key: types.NamespacedName{Namespace: "ns", Name: "r"}, uid: "u1"}
	for _, tc := range []struct {
		name         string
		cached, live *errReader
		wantErr      bool
	}{
		{"gone from both", &errReader{err: notFound}, &errReader{err: notFound}, false},
		{"gone from the informer, not the node's to read", &errReader{err: notFound}, &errReader{err: forbidden}, false},
		{"replaced by another UID", &errReader{err: notFound}, &errReader{uid: "u2"}, false},
		{"the informer has it, the live read is forbidden", &errReader{uid: "u2"}, &errReader{err: forbidden}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStatusWriter(tc.cached, tc.live, nil, clocktesting.NewFakeClock(time.Unix(0, 0)), logr.Discard())
			if err := w.write(t.Context(), u); (err != nil) != tc.wantErr {
				t.Errorf("write: %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}
