package modeldeployment

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// TestReplicaFailureOnTheDeployment: a replica that keeps failing (the agent writes
// ChecksumMismatch on its Downloaded condition) makes the deployment's
// ReplicaFailure condition True with the replica's reason and message; once the
// replica gets past it, the condition goes away.
func TestReplicaFailureOnTheDeployment(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	f.create(newDeployment("bad", "https://models.example/bad.gguf", 1, "1Gi"))
	mr := f.waitReplicas(1)[0]
	f.bind(&mr, "mac-1")

	f.waitStatus("bad", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Nodes != nil && meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure) == nil,
			fmt.Sprintf("%+v", md.Status)
	})

	const msg = "sha256 mismatch for https://models.example/bad.gguf: expected aa, the downloaded file has bb; retrying at 2026-03-01T12:00:10Z"
	setDownloaded := func(status metav1.ConditionStatus, reason, message string) {
		t.Helper()
		before := mr.DeepCopy()
		meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaDownloaded, Status: status, Reason: reason, Message: message})
		if err := f.c.Status().Patch(t.Context(), &mr, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	setDownloaded(metav1.ConditionFalse, v1alpha1.ReasonChecksumMismatch, msg)
	md := f.waitStatus("bad", func(md *v1alpha1.ModelDeployment) (bool, string) {
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonChecksumMismatch,
			condition(md, v1alpha1.DeploymentReplicaFailure)
	})
	c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
	if want := fmt.Sprintf("1 of 1 replicas failing; replica %s on mac-1: Downloaded ChecksumMismatch: %s", mr.Name, msg); c.Message != want {
		t.Errorf("ReplicaFailure message\n  %q\nwant\n  %q", c.Message, want)
	}
	if !strings.HasPrefix(condition(md, v1alpha1.DeploymentAvailable), "False/") {
		t.Errorf("Available %s", condition(md, v1alpha1.DeploymentAvailable))
	}

	setDownloaded(metav1.ConditionTrue, v1alpha1.ReasonStored, "stored")
	f.markReady(&mr)
	f.waitStatus("bad", func(md *v1alpha1.ModelDeployment) (bool, string) {
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		return c == nil && md.Status.ReadyReplicas == 1, condition(md, v1alpha1.DeploymentReplicaFailure)
	})
}
