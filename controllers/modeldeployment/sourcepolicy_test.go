package modeldeployment

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// setSourcePolicy replaces the package's SourcePolicy spec until the test ends.
func setSourcePolicy(t *testing.T, mutate func(*v1alpha1.SourcePolicySpec)) {
	t.Helper()
	c := apiServer(t).Client
	apply := func(ctx context.Context, spec v1alpha1.SourcePolicySpec) error {
		sp := &v1alpha1.SourcePolicy{}
		if err := c.Get(ctx, types.NamespacedName{Name: v1alpha1.SourcePolicyName}, sp); err != nil {
			return err
		}
		sp.Spec = spec
		return c.Update(ctx, sp)
	}
	spec := testSourcePolicy().Spec
	mutate(&spec)
	if err := apply(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := apply(context.Background(), testSourcePolicy().Spec); err != nil {
			t.Errorf("restoring the SourcePolicy: %v", err)
		}
	})
}

// TestSourcePolicy: a deployment whose source the policy denies gets no estimate and
// no replica, and its conditions name the fix; an address denied when the estimate
// connects is reported the same way; a policy change takes effect at once.
func TestSourcePolicy(t *testing.T) {
	srv := newGGUFServer(t, true)
	f := newFixture(t)
	f.start(&Reconciler{Resolver: &modelsource.Resolver{HFEndpoint: srv.URL + "/hub"}})

	waitReason := func(name, reason, msg string) {
		t.Helper()
		md := f.waitStatus(name, func(md *v1alpha1.ModelDeployment) (bool, string) {
			c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentProgressing)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason, condition(md, v1alpha1.DeploymentProgressing)
		})
		for _, typ := range []string{v1alpha1.DeploymentProgressing, v1alpha1.DeploymentScheduled} {
			if c := meta.FindStatusCondition(md.Status.Conditions, typ); c == nil || c.Reason != reason || !strings.Contains(c.Message, msg) {
				t.Errorf("%s is %s, want reason %s and a message containing %q", typ, condition(md, typ), reason, msg)
			}
		}
	}

	// Denied by the rules: nothing is fetched or created.
	n := srv.requests.Load()
	f.create(newDeployment("denied", "https://elsewhere.example/m.gguf", 2, ""))
	waitReason("denied", v1alpha1.ReasonSourceNotAllowed,
		`source host "elsewhere.example" is not allowed for namespace "`+f.ns+`": add it to spec.rules[].hosts of a rule for namespace "`+f.ns+`" in SourcePolicy "default"`)
	if reps := f.replicas(); len(reps) != 0 {
		t.Fatalf("replicas %v created for a denied source", names(reps))
	}

	// Allowed by the rules, but "localhost" resolves to loopback, which the policy no
	// longer allows: the estimate's connection is refused.
	setSourcePolicy(t, func(s *v1alpha1.SourcePolicySpec) { s.AllowedNetworks = nil })
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	src := fmt.Sprintf("http://localhost:%s/model.gguf", port)
	f.create(newDeployment("loop", src, 1, ""))
	waitReason("loop", v1alpha1.ReasonSourceNotAllowed, "is loopback, which model fetches may not connect to: to allow it, add")
	if got := srv.requests.Load(); got != n {
		t.Errorf("the model server saw %d requests, want none", got-n)
	}

	// Allowing loopback again lets the estimate run at once (no backoff wait), and
	// the replica is created.
	setSourcePolicy(t, func(*v1alpha1.SourcePolicySpec) {}) // the package's policy, which allows loopback
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		md := f.deployment("loop")
		return md.Status.EstimatedMemory != nil && md.Status.Replicas == 1, fmt.Sprintf("%+v", md.Status)
	})
}
