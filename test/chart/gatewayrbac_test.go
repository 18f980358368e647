package chart

import (
	"fmt"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// checkGatewaySecrets asks the API server what the installed chart lets the gateway's
// ServiceAccount do with Secrets: read its certificate and the manager's key index by
// name, and nothing else — not the fleet CA's key, not any namespace's Secrets
// (TestAttackGatewayReadsTheCAKey tries the same with a real token on the local fleet).
// The manager's may watch the key Secrets of every namespace and write the index.
func checkGatewaySecrets(t *testing.T, env *testenv.Env) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const gateway, manager = "system:serviceaccount:" + installNamespace + ":macfleet-gateway",
		"system:serviceaccount:" + installNamespace + ":macfleet-manager"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + installNamespace, "system:authenticated"}
	for _, tc := range []struct {
		verb, namespace, name string
		allowed               bool
		user                  string
	}{
		{"list", "", "", true, manager},
		{"watch", "", "", true, manager},
		{"get", installNamespace, "macfleet-api-keys", true, manager},
		{"create", installNamespace, "", true, manager},
		{"update", installNamespace, "macfleet-api-keys", true, manager},
		{"get", installNamespace, "macfleet-gateway-tls", true, gateway},
		{"get", installNamespace, "macfleet-api-keys", true, gateway},
		{"watch", installNamespace, "macfleet-api-keys", true, gateway},
		{"get", installNamespace, "macfleet-ca", false, gateway},
		{"list", installNamespace, "", false, gateway},
		{"list", "", "", false, gateway},
		{"watch", "", "", false, gateway},
		{"get", "team-a", "database", false, gateway},
		{"list", "team-a", "", false, gateway},
		{"update", installNamespace, "macfleet-api-keys", false, gateway},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: tc.user, Groups: groups,
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: tc.verb, Resource: "secrets", Namespace: tc.namespace, Name: tc.name}}}
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("%s may %s Secret %s: %v, want %v (%s)", tc.user, tc.verb,
				fmt.Sprintf("%s/%s", tc.namespace, tc.name), got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}
}
