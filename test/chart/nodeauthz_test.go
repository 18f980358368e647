package chart

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/nodeauthz"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestNodeAuthorizationModes: mode webhook runs the node authorizer — the manager's
// flags, its Service, a certificate the API server can verify — and grants node
// identities no replica reads; mode rbac renders the grant of config/agent-replica-reads
// instead, and no authorizer; mode auto (the default) renders both.
func TestNodeAuthorizationModes(t *testing.T) {
	has := func(objs []*unstructured.Unstructured, kind, name string) bool {
		return slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
	}
	managerArgs := func(objs []*unstructured.Unstructured) []string {
		return findDeployment(t, objs, "macfleet-manager").Spec.Template.Spec.Containers[0].Args
	}
	const bind = "--node-authorizer-bind-address=:9443"
	const clientCA = "--node-authorizer-client-ca=/etc/macfleet/node-authorizer-tls/ca.crt"

	t.Run("auto, the default", func(t *testing.T) {
		objs := render(t)
		if !slices.Contains(managerArgs(objs), bind) || !has(objs, "Service", "macfleet-node-authorizer") {
			t.Errorf("mode auto does not run the node authorizer: manager args %v", managerArgs(objs))
		}
		if !has(objs, "ClusterRoleBinding", "macfleet-agent-replica-reads") {
			t.Error("mode auto does not render the fallback grant of replica reads")
		}
	})

	t.Run("webhook", func(t *testing.T) {
		objs := render(t, "nodeAuthorization.mode=webhook")
		if !slices.Contains(managerArgs(objs), bind) {
			t.Errorf("manager args %v lack %s", managerArgs(objs), bind)
		}
		if has(objs, "ClusterRole", "macfleet-agent-replica-reads") || has(objs, "ClusterRoleBinding", "macfleet-agent-replica-reads") {
			t.Error("mode webhook renders the weaker mode's replica reads")
		}
		rules, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRole", "macfleet-agent").Object, "rules")
		for _, r := range rules {
			m := r.(map[string]any)
			res, verbs := m["resources"].([]any), m["verbs"].([]any)
			for _, want := range []any{"modelreplicas", "modelreplicas/status"} {
				if slices.Contains(res, want) && (slices.Contains(verbs, any("get")) || slices.Contains(verbs, any("list")) || slices.Contains(verbs, any("watch"))) {
					t.Errorf("ClusterRole macfleet-agent grants %v on %s", verbs, want)
				}
			}
		}
		svc := find(t, objs, "Service", "macfleet-node-authorizer")
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		if len(ports) != 1 || ports[0].(map[string]any)["targetPort"] != "node-authz" {
			t.Errorf("Service macfleet-node-authorizer ports %v, want one to node-authz", ports)
		}

		// The generated certificate is valid for the Service's name under its CA.
		data, _, _ := unstructured.NestedStringMap(find(t, objs, "Secret", "macfleet-node-authorizer-tls").Object, "data")
		pemOf := func(k string) []byte {
			b, err := base64.StdEncoding.DecodeString(data[k])
			if err != nil || len(b) == 0 {
				t.Fatalf("Secret macfleet-node-authorizer-tls %s: %v", k, err)
			}
			return b
		}
		pemOf("tls.key")
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemOf("ca.crt")) {
			t.Fatal("ca.crt holds no certificate")
		}
		block, _ := pem.Decode(pemOf("tls.crt"))
		if block == nil {
			t.Fatal("tls.crt holds no PEM")
		}
		crt, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, DNSName: "macfleet-node-authorizer." + testNamespace + ".svc"}); err != nil {
			t.Errorf("the node authorizer's certificate: %v", err)
		}

		// The API server's client certificate is one the manager's client CA (ca.crt
		// above, passed with --node-authorizer-client-ca) accepts for client auth.
		if !slices.Contains(managerArgs(objs), clientCA) {
			t.Errorf("manager args %v lack %s", managerArgs(objs), clientCA)
		}
		client, _, _ := unstructured.NestedStringMap(find(t, objs, "Secret", "macfleet-node-authorizer-client").Object, "data")
		cb, err := base64.StdEncoding.DecodeString(client["tls.crt"])
		if err != nil {
			t.Fatal(err)
		}
		if kb, err := base64.StdEncoding.DecodeString(client["tls.key"]); err != nil || len(kb) == 0 {
			t.Errorf("the client certificate's key: %v", err)
		}
		if client["ca.crt"] != data["ca.crt"] {
			t.Error("the client Secret's ca.crt is not the CA of the webhook's serving certificate")
		}
		if block, _ = pem.Decode(cb); block == nil {
			t.Fatal("the client tls.crt holds no PEM")
		}
		if crt, err = x509.ParseCertificate(block.Bytes); err != nil {
			t.Fatal(err)
		}
		if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("the API server's client certificate: %v", err)
		}
	})

	t.Run("webhook without client auth", func(t *testing.T) {
		objs := render(t, "nodeAuthorization.webhook.clientAuth=false")
		if slices.Contains(managerArgs(objs), clientCA) || has(objs, "Secret", "macfleet-node-authorizer-client") {
			t.Error("clientAuth=false still asks for a client certificate or renders one")
		}
	})

	t.Run("webhook with a Secret of one's own", func(t *testing.T) {
		objs := render(t, "nodeAuthorization.webhook.createCert=false", "nodeAuthorization.webhook.certSecret=mine")
		if has(objs, "Secret", "macfleet-node-authorizer-tls") || has(objs, "Secret", "mine") {
			t.Error("createCert=false renders a certificate Secret")
		}
		vols := findDeployment(t, objs, "macfleet-manager").Spec.Template.Spec.Volumes
		if !slices.ContainsFunc(vols, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "mine" }) {
			t.Errorf("manager volumes %+v do not mount Secret mine", vols)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		objs := render(t, "nodeAuthorization.mode=rbac")
		for _, a := range managerArgs(objs) {
			if a == bind {
				t.Errorf("mode rbac passes %s", a)
			}
		}
		if has(objs, "Service", "macfleet-node-authorizer") || has(objs, "Secret", "macfleet-node-authorizer-tls") {
			t.Error("mode rbac renders the node authorizer's Service or certificate")
		}
		src, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "agent-replica-reads", "rbac.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeObjects(t, src) {
			if diff := cmp.Diff(normalized(o), normalized(find(t, objs, o.GetKind(), o.GetName()))); diff != "" {
				t.Errorf("%s %s differs from config/agent-replica-reads (-config +chart):\n%s", o.GetKind(), o.GetName(), diff)
			}
		}
	})
}

// checkDefaultNodeAuthorization: on an API server with no authorization webhook (a
// managed control plane), under the chart's default values a Mac's credential, as
// `macfleet nodes credentials` issues it, reads the replicas bound to it — what its
// agent's informer lists and watches — and the preflight names the mode in force.
func checkDefaultNodeAuthorization(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := t.Context()
	const node = "mac-auto"
	cred, err := credentials.Issue(ctx, kubernetes.NewForConfigOrDie(env.Config), env.Config, node, credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cred.NodeAuthorization != nodeauthz.ModeRBAC {
		t.Errorf("the credential's preflight says %q, want %q", cred.NodeAuthorization, nodeauthz.ModeRBAC)
	}
	if mode, err := nodeauthz.Preflight(ctx, kubernetes.NewForConfigOrDie(env.Config)); err != nil || mode != nodeauthz.ModeRBAC {
		t.Errorf("Preflight = %q, %v; want %q", mode, err, nodeauthz.ModeRBAC)
	}

	ns := testenv.NewNamespace(t, env.Client)
	replica := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "macfleet.dev/v1alpha1", "kind": "ModelReplica",
		"metadata": map[string]any{"namespace": ns, "name": "r-0"},
		"spec": map[string]any{"template": map[string]any{"model": map[string]any{"source": "hf://team/model/m.gguf"}},
			"templateHash": "h", "memoryReservation": "1Gi", "nodeName": node},
	}}
	if err := env.Client.Create(ctx, replica); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	mac, err := client.New(rc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "macfleet.dev", Version: "v1alpha1", Kind: "ModelReplicaList"})
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := mac.List(ctx, list, client.MatchingFields{v1alpha1.ReplicaNodeNameField: node})
		return err == nil && len(list.Items) == 1, fmt.Sprintf("the Mac listing its replicas: %v, %d items, want 1", err, len(list.Items))
	})
	if err := mac.Get(ctx, client.ObjectKeyFromObject(replica), replica.DeepCopy()); err != nil {
		t.Errorf("the Mac getting its replica: %v", err)
	}
}
