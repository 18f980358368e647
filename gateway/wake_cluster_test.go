package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// gatewayUser is the identity the chart gives the gateway (ServiceAccount
// macfleet-gateway in the fleet's namespace).
const gatewayUser = "system:serviceaccount:macfleet-system:macfleet-gateway"

// asGateway installs the gateway's ClusterRole, its Role in macfleet-system and its
// admission policy as shipped (config/rbac/gateway, config/admission/gateway-restriction.yaml),
// binds the roles to the gateway's identity and returns a config that acts as it.
func asGateway(t *testing.T, e *testenv.Env) *rest.Config {
	t.Helper()
	testenv.CreateFromFile(t, e.Client, "config/rbac/gateway/role.yaml")
	testenv.CreateFromFile(t, e.Client, "config/admission/gateway-restriction.yaml")
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "macfleet-gateway-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "macfleet-gateway"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: gatewayUser}}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	// t.Context() is done by the time cleanups run: the binding is deleted without it,
	// or the next test that acts as the gateway finds it still there.
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), b) })
	// The Role of its two Secrets in macfleet-system, bound as the chart binds it.
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: "macfleet-gateway-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "macfleet-gateway"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: gatewayUser}}}
	if err := e.Client.Create(t.Context(), rb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), rb) })
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: gatewayUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:macfleet-system", "system:authenticated"}}
	return cfg
}

// TestScaleFromZeroAsGateway runs the gateway as its own identity, with the RBAC and
// admission policy that ship: a request for an autoscaled deployment at zero replicas
// is held, the gateway's wake lands on the deployment, and once a replica is routable
// (here written by the test, as the autoscaler, scheduler and agent would) the held
// request is served. The same identity cannot change anything else of a deployment.
func TestScaleFromZeroAsGateway(t *testing.T) {
	e := cluster(t)
	cfg := asGateway(t, e)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"replica":%q}`, r.Header.Get(mfv1.HeaderReplica))
	}))
	defer up.Close()
	g := startGateway(t, e, gateway.Config{RestConfig: cfg, ColdStartTimeout: time.Minute})

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	served := f.ns + "-lazy"
	d := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lazy"},
		Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: "https://models.example/tiny.gguf", ServedName: served},
			Replicas:    ptr.To[int32](0),
			Autoscaling: &mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2}}}
	if err := e.Client.Create(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	f.cleanup(d)
	waitModel(t, g, served, f.ns, 0)

	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body := chatVia(g, served)
		done <- answer{code, body}
	}()
	var woken time.Time
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		select {
		case a := <-done:
			t.Fatalf("answered %d %s at zero replicas", a.code, a.body)
		default:
		}
		cur := &mfv1.ModelDeployment{}
		if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(d), cur); err != nil {
			return false, err.Error()
		}
		v := cur.Annotations[mfv1.AnnotationWakeRequested]
		at, err := time.Parse(time.RFC3339Nano, v)
		woken = at
		return err == nil, fmt.Sprintf("wake annotation %q", v)
	})
	if d := time.Since(woken); d < -time.Second || d > 30*time.Second {
		t.Errorf("the wake says %v, %v from now", woken, d)
	}

	// One replica, as the autoscaler, the scheduler and the agent would make it.
	f.node("mac-"+f.ns, metav1.ConditionTrue)
	f.replica("lazy-0", "lazy", "mac-"+f.ns)
	f.setReplica("lazy-0", metav1.ConditionTrue, strings.TrimPrefix(up.URL, "http://"))
	select {
	case a := <-done:
		if a.code != http.StatusOK || !strings.Contains(a.body, f.ns+"/lazy-0") {
			t.Errorf("the held request: %d %s", a.code, a.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held request was not served once a replica was routable")
	}

	// The gateway's identity may set the wake and nothing else. The API server loads
	// a new admission policy asynchronously: wait for it to deny a harmless change.
	gc, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	patch := func(body string) error {
		return gc.Patch(t.Context(), &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lazy"}},
			client.RawPatch(types.MergePatchType, []byte(body)))
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := patch(fmt.Sprintf(`{"metadata":{"annotations":{"probe":%q}}}`, time.Now().Format(time.RFC3339Nano)))
		return apierrors.IsForbidden(err), fmt.Sprintf("an annotation other than the wake: %v, want Forbidden", err)
	})
	for _, tc := range []struct{ patch, msg string }{
		{`{"spec":{"replicas":2}}`, "not change the spec of ModelDeployment " + f.ns + "/lazy"},
		{`{"metadata":{"annotations":{"note":"x"}}}`, "not note of ModelDeployment " + f.ns + "/lazy"},
		{`{"metadata":{"labels":{"tier":"gold"}}}`, "not change the labels, finalizers or owners"},
	} {
		err := patch(tc.patch)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("the gateway patching %s: %v, want Forbidden with %q", tc.patch, err, tc.msg)
		}
	}
	if err := gateway.PatchWake(gc)(t.Context(), f.ns, "lazy", time.Now()); err != nil {
		t.Errorf("the gateway's own wake after the denials: %v", err)
	}
	if err := gc.Delete(t.Context(), d.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway deleting a deployment: %v, want Forbidden", err)
	}
}
