package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The attack on the gateway's identity (docs/security.md, "1. Callers of an agent"):
// what a compromised gateway pod reads with its ServiceAccount.

// gatewayServiceAccount installs the gateway's RBAC as the chart does (the ClusterRole
// and the Role of config/rbac/gateway, bound to ServiceAccount macfleet-gateway in
// macfleet-system) and returns a config that acts with a real token of that
// ServiceAccount, as the gateway's pod does.
func gatewayServiceAccount(t *testing.T) *rest.Config {
	t.Helper()
	const name = "macfleet-gateway"
	if err := testenv.KubectlApply(t.Context(), fleet.AdminKubeconfig, "config/rbac/gateway"); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: v1alpha1.SystemNamespace}}
	for _, obj := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: name}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
	} {
		if err := fleet.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	rc := rest.AnonymousClientConfig(fleet.Env.Config)
	rc.BearerToken = serviceAccountToken(t, v1alpha1.SystemNamespace, name)
	return rc
}

// TestAttackGatewayReadsTheCAKey: an attacker who took a gateway pod uses its
// ServiceAccount token to read Secret macfleet-system/macfleet-ca (the fleet CA's
// private key, which mints any Mac's or the manager's certificate) and the teams'
// Secrets. It must now get 403 on every read of a Secret but the gateway's own two
// (its certificate and the manager's index of key hashes), while a gateway running as
// that identity still accepts a team's key created with the API and refuses it once
// deleted, each within 5 s.
func TestAttackGatewayReadsTheCAKey(t *testing.T) {
	rc := gatewayServiceAccount(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "database"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"password": []byte("team-database-password")}})
	key := newKey(t)
	createKey(t, ns, "ci-key", key)

	secrets := func(ns string) func() (any, error) {
		return func() (any, error) { return cs.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{}) }
	}
	getSecret := func(ns, name string) func() (any, error) {
		return func() (any, error) { return cs.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{}) }
	}
	for _, a := range []struct {
		what string
		try  func() (any, error)
	}{
		{"get Secret macfleet-system/macfleet-ca (the fleet CA's key)", getSecret(v1alpha1.SystemNamespace, v1alpha1.CASecret)},
		{"list the Secrets of every namespace", secrets("")},
		{"watch the Secrets of every namespace", func() (any, error) {
			w, err := cs.CoreV1().Secrets("").Watch(t.Context(), metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return w, err
		}},
		{"list the Secrets of macfleet-system", secrets(v1alpha1.SystemNamespace)},
		{"get a team's ordinary Secret", getSecret(ns, "database")},
		{"get a team's API key Secret", getSecret(ns, "ci-key")},
		{"list a team's Secrets", secrets(ns)},
		{"list the team's API key Secrets by type", func() (any, error) {
			return cs.CoreV1().Secrets("").List(t.Context(), metav1.ListOptions{FieldSelector: "type=macfleet.dev/api-key"})
		}},
	} {
		got, err := a.try()
		if !apierrors.IsForbidden(err) {
			t.Errorf("the gateway's ServiceAccount could %s: %v, %s; want 403 Forbidden", a.what, err, describeSecrets(got))
		}
	}

	// The same identity's gateway still authenticates the team's keys, from the
	// manager's index.
	base, _ := inProcessGateway(t, gateway.Config{RestConfig: rc, TenantKeys: true, NoServiceAccountTokens: true}, testr.New(t))
	start := time.Now()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		code := rawGet(t, base+"/v1/models", key)
		return code == http.StatusOK, fmt.Sprintf("the team's key through the gateway acting as its ServiceAccount: %d", code)
	})
	t.Logf("the gateway accepted the key %v after it started", time.Since(start).Round(time.Millisecond))
	if code := rawGet(t, base+"/v1/models", newKey(t)); code != http.StatusUnauthorized {
		t.Errorf("a key no Secret holds: %d, want 401", code)
	}
	key2 := newKey(t)
	created := time.Now()
	s2 := createKey(t, ns, "new-key", key2)
	testenv.Eventually(t, keyWait, 20*time.Millisecond, func() (bool, string) {
		code := rawGet(t, base+"/v1/models", key2)
		return code == http.StatusOK, fmt.Sprintf("a key created with the API: %d", code)
	})
	t.Logf("a key created as a Secret worked after %v", time.Since(created).Round(time.Millisecond))
	if err := fleet.Client.Delete(t.Context(), s2); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testenv.Eventually(t, keyWait, 20*time.Millisecond, func() (bool, string) {
		code := rawGet(t, base+"/v1/models", key2)
		return code == http.StatusUnauthorized, fmt.Sprintf("a key deleted with the API: %d", code)
	})
	t.Logf("a deleted key was refused after %v", time.Since(deleted).Round(time.Millisecond))
}

// describeSecrets says what a read returned: the Secrets and their data fields.
func describeSecrets(obj any) string {
	var items []corev1.Secret
	switch o := obj.(type) {
	case *corev1.Secret:
		if o != nil {
			items = []corev1.Secret{*o}
		}
	case *corev1.SecretList:
		if o != nil {
			items = o.Items
		}
	}
	if len(items) == 0 {
		return "no Secret"
	}
	var out []string
	for i, s := range items {
		if i == 5 {
			out = append(out, fmt.Sprintf("and %d more", len(items)-i))
			break
		}
		var fields []string
		for f := range s.Data {
			fields = append(fields, f)
		}
		out = append(out, fmt.Sprintf("%s/%s %v", s.Namespace, s.Name, fields))
	}
	return "read " + strings.Join(out, ", ")
}
