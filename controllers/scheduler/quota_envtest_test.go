package scheduler

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestQuotaHoldsReplicasBack runs the scheduler against the API server with a
// FleetQuota of 16GiB in the test's namespace and a fleet with room for much more: a
// replica that would take the namespace past 16GiB stays unbound with QuotaExceeded
// (and an Event saying why), and is bound without anything else happening once the
// quota is raised, and again once another replica of the namespace is deleted.
func TestQuotaHoldsReplicasBack(t *testing.T) {
	f := newFixture(t)
	r := f.startScheduler()
	f.createNode(nodeSpec{name: "a", ceiling: 64})
	f.createNode(nodeSpec{name: "b", ceiling: 64})
	f.createDeployment("chat", v1alpha1.Placement{MaxReplicasPerNode: 4})
	fq := &v1alpha1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "team"},
		Spec: v1alpha1.FleetQuotaSpec{Memory: *qty(16)}}
	if err := f.c.Create(f.t.Context(), fq); err != nil {
		t.Fatal(err)
	}
	f.waitCached(r, []string{"a", "b"}, []string{"chat"})
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		err := r.Client.Get(t.Context(), client.ObjectKeyFromObject(fq), &v1alpha1.FleetQuota{})
		return err == nil, "the scheduler's cache lacks the FleetQuota"
	})

	f.createReplica(replicaSpec{name: "chat-0", deployment: "chat", memory: 10})
	f.waitScheduled("chat-0", metav1.ConditionTrue, v1alpha1.ReasonBound)
	f.createReplica(replicaSpec{name: "chat-1", deployment: "chat", memory: 10, residency: v1alpha1.ResidencyOnDemand})
	held := f.waitScheduled("chat-1", metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)
	msg := "namespace " + f.ns + " is out of fleet memory quota: the replica needs 10.0GiB, FleetQuota team allows 16.0GiB and 10.0GiB is in use; " +
		"raise the FleetQuota's spec.memory or scale down a deployment in " + f.ns
	if c := findScheduled(held); c.Message != msg {
		t.Errorf("Scheduled message:\n  %s\nwant\n  %s", c.Message, msg)
	}
	f.waitEvent("chat-1", EventFailedScheduling, msg)

	// Raised: the waiting replica is bound.
	before := fq.DeepCopy()
	fq.Spec.Memory = *qty(20)
	if err := f.c.Patch(t.Context(), fq, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	f.waitScheduled("chat-1", metav1.ConditionTrue, v1alpha1.ReasonBound)

	// Full again; a replica deleted makes room for the next one.
	f.createReplica(replicaSpec{name: "chat-2", deployment: "chat", memory: 10})
	f.waitScheduled("chat-2", metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)
	if err := f.c.Delete(t.Context(), &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "chat-0"}}); err != nil {
		t.Fatal(err)
	}
	f.waitScheduled("chat-2", metav1.ConditionTrue, v1alpha1.ReasonBound)

	// A quota deleted limits nothing any more.
	f.createReplica(replicaSpec{name: "chat-3", deployment: "chat", memory: 10})
	f.waitScheduled("chat-3", metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)
	if err := f.c.Delete(context.Background(), fq); err != nil {
		t.Fatal(err)
	}
	n := f.waitScheduled("chat-3", metav1.ConditionTrue, v1alpha1.ReasonBound)
	if !strings.HasPrefix(n.Spec.NodeName, f.ns) {
		t.Errorf("chat-3 bound to %s, not a node of the test", n.Spec.NodeName)
	}
}

func findScheduled(r *v1alpha1.ModelReplica) metav1.Condition {
	for _, c := range r.Status.Conditions {
		if c.Type == v1alpha1.ReplicaScheduled {
			return c
		}
	}
	return metav1.Condition{}
}
