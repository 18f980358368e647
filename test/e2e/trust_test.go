package e2e

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestSourcePolicyAndReplicaFailure: in the running fleet, the admission policy
// refuses sources the fleet's SourcePolicy does not grant, and a replica whose
// download fails its checksum shows on the deployment, in `kubectl describe md`.
func TestSourcePolicyAndReplicaFailure(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	for _, tc := range []struct{ src, want string }{
		{"https://evil.example/m.gguf", `source host "evil.example" is not allowed for namespace "` + ns + `"`},
		{"file:///etc/passwd", `file /etc/passwd is not under a directory allowed for namespace "` + ns + `"`},
	} {
		md := deployment(ns, "denied", 1, func(md *v1alpha1.ModelDeployment) {
			md.Spec.Model.Source = tc.src
			md.Spec.Resources = &v1alpha1.ModelResources{Memory: ptr.To(resource.MustParse("256Mi"))}
		})
		err := fleet.Client.Create(t.Context(), md)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `SourcePolicy "default"`) {
			t.Errorf("creating a deployment of %s: %v; want a 403 containing %q", tc.src, err, tc.want)
		}
	}

	const wrong = "0000000000000000000000000000000000000000000000000000000000000000"
	create(t, deployment(ns, "corrupt", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.SHA256 = wrong
		md.Spec.ProgressDeadlineSeconds = ptr.To[int32](10)
	}))
	var md v1alpha1.ModelDeployment
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "corrupt"}, &md); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonChecksumMismatch,
			"ReplicaFailure: " + conditionText(c)
	})

	// After progressDeadlineSeconds without progress, Progressing turns False and names
	// the failing replica.
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "corrupt"}, &md); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentProgressing)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonProgressDeadlineExceeded &&
				strings.Contains(c.Message, "(progressDeadlineSeconds 10)") && strings.Contains(c.Message, "ChecksumMismatch"),
			"Progressing: " + conditionText(c)
	})

	if out := kubectl(t, ns, "get", "md", "corrupt"); !strings.Contains(out, "FAILURE") || !strings.Contains(out, "ChecksumMismatch") {
		t.Errorf("kubectl get md does not show the failure:\n%s", out)
	}
	out := kubectl(t, ns, "describe", "md", "corrupt")
	// describe wraps long messages; the reason and the start of the message are on
	// one line.
	for _, want := range []string{"ReplicaFailure", "ChecksumMismatch", "1 of 1 replicas failing", "sha256 mismatch",
		"ProgressDeadlineExceeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl describe md lacks %q:\n%s", want, out)
		}
	}
}

func conditionText(c *metav1.Condition) string {
	if c == nil {
		return "not set"
	}
	return string(c.Status) + "/" + c.Reason + ": " + c.Message
}
