package sourcepolicy

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// installAdmission creates the objects of config/admission/source-policy.yaml, as
// shipped.
func installAdmission(t *testing.T, c client.Client) {
	t.Helper()
	testenv.CreateFromFile(t, c, "config/admission/source-policy.yaml")
}

func deploymentOf(ns, name, src string) *v1alpha1.ModelDeployment {
	mem := resource.MustParse("1Gi")
	return &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ModelDeploymentSpec{Model: v1alpha1.ModelSource{Source: src}, Replicas: ptr.To[int32](1),
			Resources: &v1alpha1.ModelResources{Memory: &mem}},
	}
}

// TestAdmissionMatchesDecide runs the decision table through the shipped
// ValidatingAdmissionPolicy on a real API server: every source is admitted exactly
// when DecideSource allows it, and refused with DecideSource's reason.
func TestAdmissionMatchesDecide(t *testing.T) {
	env := testenv.Start(t, testenv.WithScheme(v1alpha1.AddToScheme))
	c := env.Client
	ctx := t.Context()

	// Without a SourcePolicy the binding lets everything through (the manager and
	// the agents apply the built-in default).
	installAdmission(t, c)
	for _, ns := range []string{"team-a", "team-b", "team-c", "team-z"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, deploymentOf("team-z", "before", "https://anything.example/m.gguf"), client.DryRunAll); err != nil {
		t.Fatalf("without a SourcePolicy: %v, want admitted", err)
	}

	sp := &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName}, Spec: fleetSpec()}
	if err := c.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	// The API server loads the policy and its params a moment later.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := c.Create(ctx, deploymentOf("team-z", "probe", "https://anything.example/m.gguf"), client.DryRunAll)
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), "not denied yet: " + errText(err)
	})

	p := fleetPolicy(t)
	checked := 0
	for i, tc := range decideCases {
		want := p.DecideSource(tc.ns, tc.src)
		if strings.Contains(want.Reason, "invalid model source") {
			continue // the CRD's own validation refuses it
		}
		checked++
		t.Run(tc.name, func(t *testing.T) {
			md := deploymentOf(tc.ns, "md-"+string(rune('a'+i%26))+"-x", tc.src)
			err := c.Create(ctx, md, client.DryRunAll)
			if want.Allowed {
				if err != nil {
					t.Fatalf("admission refused %s in %s: %v; DecideSource allows it", tc.src, tc.ns, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("admission let %s in %s through; DecideSource says %q", tc.src, tc.ns, want.Reason)
			}
			if !strings.Contains(err.Error(), want.Reason) {
				t.Errorf("admission error\n  %s\ndoes not carry DecideSource's reason\n  %s", err, want.Reason)
			}
		})
	}
	if checked < 20 {
		t.Fatalf("only %d cases checked", checked)
	}

	// A deployment admitted before the policy forbade its source can still be
	// scaled; changing its source to a denied one is refused.
	old := deploymentOf("team-z", "grandfathered", "hf://org/repo/m.gguf")
	if err := c.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	sp.Spec.Rules[0].Registries = []v1alpha1.SourceRegistry{v1alpha1.RegistryOllama}
	if err := c.Update(ctx, sp); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := c.Create(ctx, deploymentOf("team-z", "probe2", "hf://org/repo/m.gguf"), client.DryRunAll)
		return err != nil, "hf:// still admitted: " + errText(err)
	})
	old.Spec.Replicas = ptr.To[int32](3)
	if err := c.Update(ctx, old); err != nil {
		t.Errorf("scaling a deployment whose source the policy no longer allows: %v", err)
	}
	old.Spec.Model.Source = "https://evil.example/m.gguf"
	err := c.Update(ctx, old)
	const want = `modeldeployments.macfleet.dev "grandfathered" is forbidden: ValidatingAdmissionPolicy 'macfleet-source-policy' ` +
		`with binding 'macfleet-source-policy' denied request: source host "evil.example" is not allowed for namespace "team-z": ` +
		`add it to spec.rules[].hosts of a rule for namespace "team-z" in SourcePolicy "default"`
	if !apierrors.IsForbidden(err) || err.Error() != want {
		t.Errorf("changing the source to a denied one: %v\nwant the 403\n%s", err, want)
	}
}

func errText(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}
