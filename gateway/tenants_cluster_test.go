package gateway_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestTenantKeysAsGateway runs the gateway with --tenant-keys as its own identity,
// with the roles that ship, beside the manager's key index publisher: it can watch the
// index, a key Secret created works within 5 s and a deleted one stops, and a key in
// an Opaque Secret is not a key.
// It can review ServiceAccount tokens: one projected for the fleet's audience works,
// one for the API server's audience is a 401.
func TestTenantKeysAsGateway(t *testing.T) {
	e := cluster(t)
	g := startGateway(t, e, gateway.Config{RestConfig: asGateway(t, e), TenantKeys: true})
	ns := testenv.NewNamespace(t, e.Client)
	const key, opaqueKey = "tenant-key-0123456789abcdef", "opaque-key-0123456789abcdef"
	if code, body := get(g.url+"/v1/models", key); code != http.StatusUnauthorized {
		t.Fatalf("a key before its Secret: %d %s", code, body)
	}
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-a-key"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{tenancy.KeyField: []byte(opaqueKey)}}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "key"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	for _, obj := range []*corev1.Secret{opaque, s} {
		if err := e.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := get(g.url+"/v1/models", key)
		return code == http.StatusOK, fmt.Sprintf("the new key: %d %s", code, body)
	})
	if code, body := get(g.url+"/v1/models", opaqueKey); code != http.StatusUnauthorized {
		t.Errorf("the key of an Opaque Secret: %d %s, want 401", code, body)
	}
	cs := kubernetes.NewForConfigOrDie(e.Config)
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ci"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for aud, want := range map[string]int{satoken.DefaultAudience: http.StatusOK, "": http.StatusUnauthorized} {
		tr := &authnv1.TokenRequest{}
		if aud != "" {
			tr.Spec.Audiences = []string{aud}
		}
		tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), "ci", tr, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(g.url+"/v1/models", tok.Status.Token); code != want {
			t.Errorf("a ServiceAccount token for audience %q: %d %s, want %d", aud, code, body, want)
		}
	}
	if err := e.Client.Delete(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := get(g.url+"/v1/models", key)
		return code == http.StatusUnauthorized, fmt.Sprintf("the deleted key: %d %s", code, body)
	})
}
