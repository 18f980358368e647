package chart

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// installNamespace is where the agents look for the fleet token.
const installNamespace = "macfleet-system"

// TestInstallUpgradeUninstall installs the chart into a real API server that has no
// CRDs yet (the chart brings them), upgrades it and uninstalls it. No kubelet runs, so
// the Deployments exist without pods.
func TestInstallUpgradeUninstall(t *testing.T) {
	env := testenv.Start(t, testenv.WithCRDPaths())
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	c := env.Client
	ctx := t.Context()

	// The NetworkPolicies are off by default; on here, so that the real API server
	// validates them.
	var values []string
	for _, s := range networkPolicyOn {
		values = append(values, "--set", s)
	}
	// The install also takes tunnels (Macs behind NAT), so that the real API server
	// validates their Service and NetworkPolicy rule; the upgrade below, at three
	// gateway replicas, leaves them off (a tunnel needs one replica) and removes them.
	installValues := append(slices.Clone(values), "--set", "gateway.tunnel.enabled=true",
		"--set", "networkPolicy.gateway.tunnelPeers[0].ipBlock.cidr=203.0.113.0/24")
	notes := mustHelm(t, append([]string{"install", "macfleet", chartDir(t), "--kubeconfig", kubeconfig,
		"--namespace", installNamespace, "--create-namespace"}, installValues...)...)
	// NOTES.txt tells what to do next: node credentials, agents, the gateway.
	for _, want := range []string{"macfleet nodes credentials <mac> -o", "macfleet agent --kubeconfig", "macfleet agent install --",
		"port-forward svc/macfleet-gateway 8080:80", "/v1/chat/completions",
		// Keys are on by default: the notes tell a team how to make one.
		"create secret generic my-key --type=macfleet.dev/api-key", `-H "Authorization: Bearer <the key>"`,
		`SourcePolicy "default" grants its namespace (from the chart's sourcePolicy values):`, "kubectl get sourcepolicy default"} {
		if !strings.Contains(notes, want) {
			t.Errorf("helm install output lacks %q:\n%s", want, notes)
		}
	}

	// Everything the chart renders for this namespace must now exist: CRDs included.
	rendered := decodeObjects(t, []byte(mustHelm(t, append([]string{"template", "macfleet", chartDir(t),
		"--namespace", installNamespace, "--include-crds"}, installValues...)...)))
	if len(rendered) < 20 {
		t.Fatalf("rendered only %d objects", len(rendered))
	}
	if n := len(networkPolicies(t, rendered)); n != 2 {
		t.Errorf("rendered %d NetworkPolicies, want 2", n)
	}
	for _, o := range rendered {
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), newEmpty(o)); err != nil {
			t.Errorf("after install, %s: %v", describe(o), err)
		}
	}
	for _, o := range rendered {
		if o.GetKind() == "CustomResourceDefinition" {
			waitEstablished(t, c, o.GetName())
		}
	}

	// No shared secret: the chart creates no fleet token (the manager makes the fleet
	// CA when it runs).
	if err := c.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "macfleet-fleet-token"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the fleet token Secret after install: %v, want NotFound", err)
	}
	authzCert := secretData(t, c, "macfleet-node-authorizer-tls")
	authzClient := secretData(t, c, "macfleet-node-authorizer-client")

	mustHelm(t, append([]string{"upgrade", "macfleet", chartDir(t), "--kubeconfig", kubeconfig,
		"--namespace", installNamespace, "--set", "gateway.replicas=3", "--set", "manager.replicas=2"}, values...)...)
	// The API server's kubeconfig for the node authorizer trusts the CA made on install.
	if got := secretData(t, c, "macfleet-node-authorizer-tls"); !maps.EqualFunc(got, authzCert, bytes.Equal) || len(got["ca.crt"]) == 0 {
		t.Error("upgrade changed the node authorizer's certificate or CA")
	}
	if got := secretData(t, c, "macfleet-node-authorizer-client"); !maps.EqualFunc(got, authzClient, bytes.Equal) || len(got["tls.crt"]) == 0 {
		t.Error("upgrade changed the API server's client certificate for the node authorizer")
	}
	tunnelSvc := client.ObjectKey{Namespace: installNamespace, Name: "macfleet-gateway-tunnel"}
	if err := c.Get(ctx, tunnelSvc, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the upgrade without the tunnel, its Service: %v, want NotFound", err)
	}
	for name, want := range map[string]int32{"macfleet-gateway": 3, "macfleet-manager": 2} {
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: name}, &d); err != nil {
			t.Fatal(err)
		}
		if got := ptr.Deref(d.Spec.Replicas, 0); got != want {
			t.Errorf("after upgrade, %s has %d replicas, want %d", name, got, want)
		}
	}

	checkNodeIdentity(t, env)
	checkManagerPinsKeys(t, env)
	checkGatewaySecrets(t, env)
	checkDefaultNodeAuthorization(t, env)

	// A release whose CA was made without a client certificate (the Secret gone, as
	// from a chart before clientAuth) cannot get one signed: the upgrade fails and
	// says what to do, and nothing changes.
	if err := c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: installNamespace, Name: "macfleet-node-authorizer-client"}}); err != nil {
		t.Fatal(err)
	}
	_, err := helm(t, append([]string{"upgrade", "macfleet", chartDir(t), "--kubeconfig", kubeconfig,
		"--namespace", installNamespace, "--reuse-values"}, values...)...)
	if err == nil || !strings.Contains(err.Error(), "Delete Secret macfleet-node-authorizer-tls") ||
		!strings.Contains(err.Error(), "nodeAuthorization.webhook.clientAuth=false") {
		t.Errorf("upgrading without the client certificate: %v, want a failure naming both ways out", err)
	}
	if got := secretData(t, c, "macfleet-node-authorizer-tls"); !maps.EqualFunc(got, authzCert, bytes.Equal) {
		t.Error("the failed upgrade changed the node authorizer's certificate")
	}

	mustHelm(t, "uninstall", "macfleet", "--kubeconfig", kubeconfig, "--namespace", installNamespace)
	for _, o := range rendered {
		testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
			obj := newEmpty(o)
			err := c.Get(ctx, client.ObjectKeyFromObject(o), obj)
			switch {
			case o.GetKind() == "CustomResourceDefinition":
				// Helm never deletes the CRDs it installed from crds/, so that
				// uninstalling cannot delete every ModelDeployment.
				return err == nil, fmt.Sprintf("%s: %v", describe(o), err)
			case apierrors.IsNotFound(err):
				return true, ""
			case err == nil && o.GetKind() == "Namespace" && obj.GetDeletionTimestamp() != nil:
				return true, "" // no namespace controller in envtest to finish the deletion
			default:
				return false, fmt.Sprintf("%s still exists after uninstall (get: %v)", describe(o), err)
			}
		})
	}
}

func newEmpty(o *unstructured.Unstructured) *unstructured.Unstructured {
	e := &unstructured.Unstructured{}
	e.SetGroupVersionKind(o.GroupVersionKind())
	return e
}

func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func secretData(t *testing.T, c client.Client, name string) map[string][]byte {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: installNamespace, Name: name}, &s); err != nil {
		t.Fatalf("getting Secret %s: %v", name, err)
	}
	return s.Data
}

func waitEstablished(t *testing.T, c client.Client, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range conds {
			if m, ok := cond.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("CRD %s is not Established: %v", name, conds)
	})
}

// checkNodeIdentity acts as the agent of Mac mac-1 (ServiceAccount macfleet-nodes/mac-1)
// with the RBAC and admission policy the chart installed: it reads the fleet CA
// bundle and registers its own MacNode, but cannot read the CA's or the gateway's
// Secret, list Secrets or register another Mac.
func checkNodeIdentity(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := t.Context()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:macfleet-nodes:mac-1",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:macfleet-nodes", "system:authenticated"},
	}
	nc, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	// The bundle the manager publishes (made here as the manager would).
	bundle := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNamespace, Name: "macfleet-ca"}}
	if err := env.Client.Create(ctx, bundle); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := nc.Get(ctx, client.ObjectKeyFromObject(bundle), &corev1.ConfigMap{}); err != nil {
		t.Errorf("node mac-1 cannot read the fleet CA bundle: %v", err)
	}
	for _, name := range []string{"macfleet-ca", "macfleet-gateway-tls", "macfleet-fleet-token", "macfleet-api-keys"} {
		if err := nc.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: name}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
			t.Errorf("node mac-1 reading Secret %s: %v, want Forbidden", name, err)
		}
	}
	if err := nc.List(ctx, &corev1.SecretList{}, client.InNamespace(installNamespace)); !apierrors.IsForbidden(err) {
		t.Errorf("node mac-1 listing Secrets: %v, want Forbidden", err)
	}

	macNode := func(name string) *unstructured.Unstructured {
		n := &unstructured.Unstructured{}
		n.SetGroupVersionKind(schema.GroupVersionKind{Group: "macfleet.dev", Version: "v1alpha1", Kind: "MacNode"})
		n.SetName(name)
		return n
	}
	// The API server loads a new admission policy asynchronously: wait for the denial.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := nc.Create(ctx, macNode("mac-2"))
		if err == nil {
			if err := env.Client.Delete(ctx, macNode("mac-2")); err != nil {
				t.Fatal(err)
			}
		}
		return apierrors.IsForbidden(err), fmt.Sprintf("node mac-1 creating MacNode mac-2: %v, want Forbidden", err)
	})
	if err := nc.Create(ctx, macNode("mac-1")); err != nil {
		t.Errorf("node mac-1 cannot register its own MacNode: %v", err)
	}
}

// checkManagerPinsKeys: with the RBAC the chart installed, the manager's
// ServiceAccount reads and updates a Mac's binding Secret in macfleet-nodes (where
// the certificate signer pins the Mac's key) and deletes CertificateSigningRequests,
// and the Mac's own identity cannot touch the Secret.
func checkManagerPinsKeys(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := t.Context()
	as := func(user string, groups ...string) client.Client {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:serviceaccounts", "system:authenticated")}
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	manager := as("system:serviceaccount:"+installNamespace+":macfleet-manager", "system:serviceaccounts:"+installNamespace)
	node := as("system:serviceaccount:macfleet-nodes:mac-1", "system:serviceaccounts:macfleet-nodes")
	binding := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "macfleet-nodes", Name: "mac-1-credential"}}
	if err := env.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pin := func(c client.Client, value string) error {
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKeyFromObject(binding), &s); err != nil {
			return err
		}
		s.Annotations = map[string]string{"macfleet.dev/node-key-sha256": value}
		return c.Update(ctx, &s)
	}
	if err := pin(manager, "sha256:00"); err != nil {
		t.Errorf("the manager pinning a Mac's key on its binding Secret: %v", err)
	}
	if err := pin(node, "sha256:11"); !apierrors.IsForbidden(err) {
		t.Errorf("node mac-1 pinning its own key: %v, want Forbidden", err)
	}
	err := manager.Delete(ctx, &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "none"}})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the manager deleting a CertificateSigningRequest: %v, want NotFound (allowed, and there is none)", err)
	}
}
