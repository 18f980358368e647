package macnode

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// staleLeases is a cache that is behind the API server for Leases: it returns a copy
// of each Lease as it was before the test renewed it, as an informer does while it
// re-lists after the manager lost the API server. Everything else is read through.
type staleLeases struct {
	client.Client
	leases map[string]*coordinationv1.Lease
}

func (s *staleLeases) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if l, ok := obj.(*coordinationv1.Lease); ok {
		if old, ok := s.leases[key.Name]; ok {
			old.DeepCopyInto(l)
			return nil
		}
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// TestStaleCacheDoesNotMarkLiveNodeLost: a node whose Lease the cache still holds
// expired but the API server holds renewed stays Ready and keeps its replicas; a
// Lease expired in the API server too is acted on.
func TestStaleCacheDoesNotMarkLiveNodeLost(t *testing.T) {
	f := newFixture(t)
	f.stop() // this test calls Reconcile itself
	for _, tc := range []struct {
		name        string
		renewed     bool
		wantUnknown bool
	}{
		{name: "renewed in the API server", renewed: true, wantUnknown: false},
		{name: "expired in the API server too", renewed: false, wantUnknown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := f.node(map[bool]string{true: "renewed", false: "expired"}[tc.renewed], false, leaseSeconds*time.Second)
			var old coordinationv1.Lease
			if err := f.c.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: node}, &old); err != nil {
				t.Fatal(err)
			}
			// Time passes well beyond the Lease: with the renewal, the API server's
			// Lease is live again; the cache keeps the old one.
			f.clk.Step(3 * leaseSeconds * time.Second)
			if tc.renewed {
				f.renew(node)
			}
			r := &Reconciler{Client: &staleLeases{Client: f.c, leases: map[string]*coordinationv1.Lease{node: &old}},
				APIReader: f.c, Recorder: events.NewFakeRecorder(10), Clock: f.clk, NodeLossGrace: grace}
			res, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKey{Name: node}})
			if err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.MacNode
			if err := f.c.Get(t.Context(), client.ObjectKey{Name: node}, &got); err != nil {
				t.Fatal(err)
			}
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.MacNodeReady)
			if unknown := c != nil && c.Status == metav1.ConditionUnknown; unknown != tc.wantUnknown {
				t.Errorf("Ready = %+v, want Unknown: %v", c, tc.wantUnknown)
			}
			if res.RequeueAfter <= 0 {
				t.Errorf("RequeueAfter %v, want the next expiry or grace deadline", res.RequeueAfter)
			}
		})
	}
}
