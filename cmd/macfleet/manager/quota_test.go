package manager_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestNamespaceOverItsMemoryQuota runs the whole control plane with a FleetQuota of
// 4GiB in a namespace and a Mac with room for much more. Two deployments of 3GiB each
// do not both fit the quota: the second one's replica waits, and its deployment says
// why — ReplicaFailure (the Failure column of `kubectl get md`) and Scheduled with
// reason QuotaExceeded and a message naming the namespace, the quota, the figures and
// the fix — with a Warning Event, and the FleetQuota's status shows what is used by
// whom and that one replica waits. Scaling the first deployment to zero lets the
// waiting replica be placed with no other action.
func TestNamespaceOverItsMemoryQuota(t *testing.T) {
	c := env.Client
	ctx := t.Context()
	startManager(t, manager.Config{RestConfig: env.Config, NodeLossGrace: time.Minute, SchedulerWorkers: 2})
	allowModelsExample(t, c)
	ns := testenv.NewNamespace(t, c)

	// A Mac of the test's own (its label keeps other tests' replicas off it), alive:
	// its Lease is fresh for longer than the test.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.NodeLeaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	node := &mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-" + ns, Labels: map[string]string{"quota-test": ns}}}
	if err := c.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.NodeLeaseNamespace, Name: node.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name), LeaseDurationSeconds: ptr.To[int32](600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
	node.Status.Memory.Ceiling = ptr.To(resource.MustParse("64Gi"))
	node.Status.Conditions = []metav1.Condition{{Type: mfv1.MacNodeReady, Status: metav1.ConditionTrue, Reason: mfv1.ReasonAgentReady, LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &mfv1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec: mfv1.FleetQuotaSpec{Memory: resource.MustParse("4Gi")}}); err != nil {
		t.Fatal(err)
	}

	deployment := func(name string) *mfv1.ModelDeployment {
		return &mfv1.ModelDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: mfv1.ModelDeploymentSpec{
				Model:     mfv1.ModelSource{Source: "https://models.example/" + name + ".gguf"},
				Resources: &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("3Gi"))},
				Placement: mfv1.Placement{NodeSelector: map[string]string{"quota-test": ns}},
			},
		}
	}
	first, second := deployment("first"), deployment("second")
	if err := c.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, first, func(md *mfv1.ModelDeployment) (bool, string) {
		return len(md.Status.Nodes) == 1, fmt.Sprintf("nodes %v", md.Status.Nodes)
	})
	if err := c.Create(ctx, second); err != nil {
		t.Fatal(err)
	}

	msg := "namespace " + ns + " is out of fleet memory quota: the replica needs 3.0GiB, FleetQuota team allows 4.0GiB and 3.0GiB is in use; " +
		"raise the FleetQuota's spec.memory or scale down a deployment in " + ns
	waitDeployment(t, second, func(md *mfv1.ModelDeployment) (bool, string) {
		failure := meta.FindStatusCondition(md.Status.Conditions, mfv1.DeploymentReplicaFailure)
		scheduled := meta.FindStatusCondition(md.Status.Conditions, mfv1.DeploymentScheduled)
		ok := failure != nil && failure.Status == metav1.ConditionTrue && failure.Reason == mfv1.ReasonQuotaExceeded &&
			strings.HasSuffix(failure.Message, msg) &&
			scheduled != nil && scheduled.Status == metav1.ConditionFalse && scheduled.Reason == mfv1.ReasonQuotaExceeded &&
			strings.HasSuffix(scheduled.Message, msg)
		return ok, fmt.Sprintf("ReplicaFailure %+v, Scheduled %+v; want both with reason QuotaExceeded and message ending %q", failure, scheduled, msg)
	})
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		var list eventsv1.EventList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "ModelDeployment" && e.Regarding.Name == "second" && e.Type == "Warning" &&
				e.Reason == mfv1.ReasonQuotaExceeded && strings.HasSuffix(e.Note, msg) {
				return true, ""
			}
			seen = append(seen, e.Regarding.Name+" "+e.Reason)
		}
		return false, fmt.Sprintf("no Warning QuotaExceeded Event about ModelDeployment second; Events: %v", seen)
	})
	fq := &mfv1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}}
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(fq), fq); err != nil {
			return false, err.Error()
		}
		st := fq.Status
		ok := st.Used != nil && st.Used.Cmp(resource.MustParse("3Gi")) == 0 && st.WaitingReplicas == 1 &&
			len(st.Deployments) == 1 && st.Deployments[0].Name == "first" && st.Deployments[0].Replicas == 1
		return ok, fmt.Sprintf("FleetQuota status %+v; want 3Gi used by first, 1 waiting", st)
	})

	// The first deployment scaled to zero: the second's replica is placed.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(first), first); err != nil {
			return err
		}
		first.Spec.Replicas = ptr.To[int32](0)
		return c.Update(ctx, first)
	}); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, second, func(md *mfv1.ModelDeployment) (bool, string) {
		failure := meta.FindStatusCondition(md.Status.Conditions, mfv1.DeploymentReplicaFailure)
		return len(md.Status.Nodes) == 1 && failure == nil &&
				meta.IsStatusConditionTrue(md.Status.Conditions, mfv1.DeploymentScheduled),
			fmt.Sprintf("nodes %v, conditions %+v; want placed and no ReplicaFailure", md.Status.Nodes, md.Status.Conditions)
	})
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(fq), fq); err != nil {
			return false, err.Error()
		}
		st := fq.Status
		ok := st.Used != nil && st.Used.Cmp(resource.MustParse("3Gi")) == 0 && st.WaitingReplicas == 0 &&
			len(st.Deployments) == 1 && st.Deployments[0].Name == "second"
		return ok, fmt.Sprintf("FleetQuota status %+v; want 3Gi used by second, none waiting", st)
	})
}

// waitDeployment waits until cond holds for the deployment as the API server has it.
func waitDeployment(t *testing.T, md *mfv1.ModelDeployment, cond func(*mfv1.ModelDeployment) (bool, string)) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(md), md); err != nil {
			return false, err.Error()
		}
		return cond(md)
	})
}
