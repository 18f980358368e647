package chart

import (
	"fmt"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/internal/testenv"
)

// checkGatewaySecrets asks the API server what the installed chart lets the gateway's
// ServiceAccount do with Secrets: read its certificate and the manager's key index by
// name, and nothing else — not the fleet CA's key, not any namespace's Secrets
// (TestAttackGatewayReadsTheCAKey tries the same with a real token on the local fleet).
func checkGatewaySecrets(t *testing.T, env *testenv.Env) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const user = "system:serviceaccount:" + installNamespace + ":macfleet-gateway"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + installNamespace, "system:authenticated"}
	for _, tc := range []struct {
		verb, namespace, name string
		allowed               bool
	}{
		{"get", installNamespace, "macfleet-gateway-tls", true},
		{"get", installNamespace, "macfleet-api-keys", true},
		{"watch", installNamespace, "macfleet-api-keys", true},
		{"get", installNamespace, "macfleet-ca", false},
		{"list", installNamespace, "", false},
		{"list", "", "", false},
		{"watch", "", "", false},
		{"get", "team-a", "database", false},
		{"list", "team-a", "", false},
		{"update", installNamespace, "macfleet-api-keys", false},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups,
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: tc.verb, Resource: "secrets", Namespace: tc.namespace, Name: tc.name}}}
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("the gateway's ServiceAccount may %s Secret %s: %v, want %v (%s)", tc.verb,
				fmt.Sprintf("%s/%s", tc.namespace, tc.name), got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}
}
