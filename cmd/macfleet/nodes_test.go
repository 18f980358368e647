package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki/keypin"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestNodesCredentials runs `macfleet nodes credentials` against a real API server on
// which only the namespaces exist (no agent RBAC, no policy).
func TestNodesCredentials(t *testing.T) {
	env := testenv.Start(t, testenv.WithScheme(v1alpha1.AddToScheme))
	for _, ns := range []string{v1alpha1.NodeIdentityNamespace, v1alpha1.SystemNamespace} {
		if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	adminKC := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(adminKC, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	// The Macs of this test run here: the API server's loopback address is right for
	// them, given explicitly (without --server it is refused: below).
	server := env.Config.Host
	run := func(args ...string) (stdout, stderr string, err error) {
		var out, errOut bytes.Buffer
		cmd := nodesCredentialsCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SilenceUsage = true
		err = cmd.ExecuteContext(t.Context())
		return out.String(), errOut.String(), err
	}

	t.Run("prints a kubeconfig", func(t *testing.T) {
		stdout, stderr, err := run("mac-a", "--kubeconfig", adminKC, "--server", "https://mac-facing.example:6443")
		if err != nil {
			t.Fatal(err)
		}
		kc, err := clientcmd.Load([]byte(stdout))
		if err != nil {
			t.Fatalf("stdout is not a kubeconfig: %v\n%s", err, stdout)
		}
		cur := kc.Contexts[kc.CurrentContext]
		if cur == nil || kc.AuthInfos[cur.AuthInfo] == nil || kc.AuthInfos[cur.AuthInfo].Token == "" {
			t.Fatalf("kubeconfig has no current context with a token:\n%s", stdout)
		}
		if got := kc.Clusters[cur.Cluster].Server; got != "https://mac-facing.example:6443" {
			t.Errorf("server = %q, want the --server URL", got)
		}
		for _, want := range []string{"Warning: ClusterRoleBinding macfleet-agent does not exist", "Warning: ValidatingAdmissionPolicyBinding macfleet-node-restriction does not exist",
			// Neither the node authorizer nor the fallback grant: the Mac would never see its replicas.
			"Warning: node authorization in force: none — a Mac cannot read the ModelReplicas bound to it"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
	})

	t.Run("writes a 0600 file", func(t *testing.T) {
		path := filepath.Join(dir, "mac-b.kubeconfig")
		stdout, stderr, err := run("mac-b", "--kubeconfig", adminKC, "--server", server, "-o", path, "--duration", "1h")
		if err != nil {
			t.Fatal(err)
		}
		if stdout != "" {
			t.Errorf("stdout = %q, want nothing when -o is given", stdout)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("kubeconfig mode %v, want 0600", fi.Mode().Perm())
		}
		rc, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Host != strings.TrimSuffix(env.Config.Host, "/") || rc.BearerToken == "" {
			t.Errorf("kubeconfig reaches %q with token %t, want %q with a token", rc.Host, rc.BearerToken != "", env.Config.Host)
		}
		if !strings.Contains(stderr, "Wrote the kubeconfig of node mac-b to "+path+" (mode 0600)") {
			t.Errorf("stderr does not say where the kubeconfig went:\n%s", stderr)
		}
	})

	t.Run("refuses the admin kubeconfig's loopback server", func(t *testing.T) {
		// k3s's admin kubeconfig says https://127.0.0.1:6443, which on a Mac is the Mac.
		stdout, _, err := run("mac-loop", "--kubeconfig", adminKC)
		if err == nil || !strings.Contains(err.Error(), "loopback address") || !strings.Contains(err.Error(), "--server https://") {
			t.Fatalf("error = %v, want a refusal naming --server", err)
		}
		if stdout != "" {
			t.Errorf("a refused credential printed %q", stdout)
		}
		err = env.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: "mac-loop"}, &corev1.ServiceAccount{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("ServiceAccount for a refused credential: %v, want NotFound", err)
		}
	})

	t.Run("rejects a bad name", func(t *testing.T) {
		_, _, err := run("Mac_C", "--kubeconfig", adminKC)
		if err == nil || !strings.Contains(err.Error(), `invalid node name "Mac_C"`) {
			t.Fatalf("error = %v, want an invalid node name", err)
		}
		err = env.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: "Mac_C"}, &corev1.ServiceAccount{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("ServiceAccount for a rejected name: %v, want NotFound", err)
		}
	})

	t.Run("sets the operator's memory bound", func(t *testing.T) {
		if _, _, err := run("mac-e", "--kubeconfig", adminKC, "--server", server, "--memory-ceiling", "180Gi"); err != nil {
			t.Fatal(err)
		}
		var mn v1alpha1.MacNode
		if err := env.Client.Get(t.Context(), client.ObjectKey{Name: "mac-e"}, &mn); err != nil {
			t.Fatal(err)
		}
		if mn.Spec.MemoryCeiling == nil || mn.Spec.MemoryCeiling.String() != "180Gi" {
			t.Errorf("MacNode mac-e spec.memoryCeiling = %v, want 180Gi", mn.Spec.MemoryCeiling)
		}
		if _, _, err := run("mac-e", "--kubeconfig", adminKC, "--memory-ceiling", "lots"); err == nil ||
			!strings.Contains(err.Error(), `--memory-ceiling "lots": want a positive size`) {
			t.Errorf("a bad --memory-ceiling: error = %v", err)
		}
	})

	t.Run("re-enrolling clears the key pin and says so", func(t *testing.T) {
		key := client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: "mac-b-credential"}
		sec := &corev1.Secret{}
		if err := env.Client.Get(t.Context(), key, sec); err != nil {
			t.Fatal(err)
		}
		const pin = "sha256:0123abcd"
		sec.Annotations[keypin.PinAnnotation] = pin // as the signer pins the agent's first key
		if err := env.Client.Update(t.Context(), sec); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := run("mac-b", "--kubeconfig", adminKC, "--server", server, "-o", filepath.Join(dir, "mac-b.kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr, "Cleared the key pinned to node mac-b ("+pin+")") {
			t.Errorf("stderr does not say the pin was cleared:\n%s", stderr)
		}
		if err := env.Client.Get(t.Context(), key, sec); err != nil {
			t.Fatal(err)
		}
		if got, ok := sec.Annotations[keypin.PinAnnotation]; ok {
			t.Errorf("after re-enrolling the pin is %q, want none", got)
		}
		_, stderr, err = run("mac-b", "--kubeconfig", adminKC, "--server", server, "-o", filepath.Join(dir, "mac-b.kubeconfig"))
		if err != nil || strings.Contains(stderr, "Cleared") {
			t.Errorf("re-enrolling without a pin: %v, stderr %q; want nothing said about a pin", err, stderr)
		}
	})

	t.Run("revokes", func(t *testing.T) {
		before := &corev1.Secret{}
		key := client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: "mac-b-credential"}
		if err := env.Client.Get(t.Context(), key, before); err != nil {
			t.Fatal(err)
		}
		cmd := nodesRevokeCmd()
		var errOut bytes.Buffer
		cmd.SetArgs([]string{"mac-b", "--kubeconfig", adminKC})
		cmd.SetErr(&errOut)
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		after := &corev1.Secret{}
		if err := env.Client.Get(t.Context(), key, after); err != nil {
			t.Fatal(err)
		}
		if after.UID == before.UID {
			t.Error("the binding Secret was not replaced")
		}
		if !strings.Contains(errOut.String(), "Revoked every token of node mac-b") {
			t.Errorf("stderr = %q", errOut.String())
		}
	})

	t.Run("explains a missing kubeconfig", func(t *testing.T) {
		_, _, err := run("mac-d", "--kubeconfig", filepath.Join(dir, "nope"))
		if err == nil || !strings.Contains(err.Error(), "loading the administrator kubeconfig") {
			t.Fatalf("error = %v, want one about the administrator kubeconfig", err)
		}
	})
}
