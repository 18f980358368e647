package e2e

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackFleetRedirectIntoTheLAN: in the running fleet, a tenant's source on the
// model host every namespace may use answers with a redirect to an address in the
// Macs' LAN, for a blind GET from the agent; the agent must refuse to follow it, and
// the deployment must say which policy field would allow it.
func TestAttackFleetRedirectIntoTheLAN(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	const lan = "http://10.20.30.40:8080/admin/reboot"
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, lan, http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	mem := resource.MustParse("256Mi")
	create(t, deployment(ns, "redirected", 1, func(md *v1alpha1.ModelDeployment) {
		// The fleet's SourcePolicy allows this host (127.0.0.1) to every namespace;
		// resources.memory spares the manager's header read: the agent fetches first.
		md.Spec.Model = v1alpha1.ModelSource{Source: redirector.URL + "/m.gguf"}
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: &mem}
	}))
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "redirected"}, &md); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		if c == nil || c.Status != metav1.ConditionTrue {
			return false, "ReplicaFailure: " + conditionText(c)
		}
		if c.Reason != v1alpha1.ReasonSourceNotAllowed {
			t.Fatalf("the agent followed the redirect into the LAN: ReplicaFailure %s", conditionText(c))
		}
		return strings.Contains(c.Message, "redirects to "+lan) && strings.Contains(c.Message, "spec.rules[].hosts"),
			"ReplicaFailure: " + conditionText(c)
	})
}
