package credentials_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
}

// This API server runs no node authorizer (internal/nodeauthz tests it), so nodes read
// replicas by the weaker mode's RBAC; the admission policy confines writes in both.
var installOnce = sync.OnceValue(func() error {
	return env.Apply(context.Background(), "config/agent", "config/agent-replica-reads", "config/admission")
})

// install applies the shipped manifests with kubectl, as an administrator would, once
// per test binary.
func install(t *testing.T) {
	t.Helper()
	if err := installOnce(); err != nil {
		t.Fatal(err)
	}
}

// issue mints a credential for node and returns a client that authenticates with the
// token from its kubeconfig, as the node's agent would.
func issue(t *testing.T, node string) (client.Client, *credentials.Credential) {
	t.Helper()
	cred, err := credentials.Issue(t.Context(), kubernetes.NewForConfigOrDie(env.Config), env.Config, node, credentials.Options{})
	if err != nil {
		t.Fatalf("Issue(%s): %v", node, err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatalf("loading the kubeconfig of %s: %v", node, err)
	}
	if rc.BearerToken == "" || rc.CertData != nil {
		t.Fatalf("kubeconfig of %s: want a bearer token and no client certificate", node)
	}
	c, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, cred
}

func macNode(name string) *v1alpha1.MacNode {
	return &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{v1alpha1.LabelChip: "Apple-M2-Max", "kubernetes.io/arch": "arm64"},
	}}
}

func replica(ns, name, node string) *v1alpha1.ModelReplica {
	return &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LabelDeployment: "qwen"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:          v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "file:///models/qwen.gguf"}},
			TemplateHash:      "abc",
			MemoryReservation: resource.MustParse("1Gi"),
			NodeName:          node,
		},
	}
}

func lease(name string) *coordinationv1.Lease { return newLease(v1alpha1.NodeLeaseNamespace, name) }

// retryUntilParamSeen calls write until it is not denied for an agent address the
// policy does not see yet, for at most 10 seconds: the policy reads the MacNodes
// (its params) from the API server's informer, which may not hold the address the
// step before wrote (an agent's status writes are retried alike).
func retryUntilParamSeen(ctx context.Context, write func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := write()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may only advertise its own agent address") ||
			time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitForPolicy polls until the admission policy denies mac-a creating MacNode
// mac-b: the API server loads a new policy a moment after it is created. Dry runs
// pass admission without writing anything.
func waitForPolicy(t *testing.T, c client.Client) {
	t.Helper()
	start := time.Now()
	defer func() { t.Logf("Waited %v for the policy to deny", time.Since(start).Round(time.Millisecond)) }()
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := c.Create(t.Context(), macNode("mac-b"), client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "may only modify its own MacNode") {
			return true, ""
		}
		return false, "the policy does not deny mac-a creating MacNode mac-b yet: " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}

// The agent addresses mac-a and mac-b register in their MacNodes' status.
const addrA, addrB = "192.0.2.10:8080", "192.0.2.11:8080"

// setReady marks a replica running at mac-a's address.
func setReady(r *v1alpha1.ModelReplica) { setReadyAt(addrA)(r) }

// setReadyAt marks a replica running at endpoint.
func setReadyAt(endpoint string) func(*v1alpha1.ModelReplica) {
	return func(r *v1alpha1.ModelReplica) {
		r.Status.Phase = v1alpha1.ReplicaRunning
		r.Status.Endpoint = endpoint
	}
}

// TestNodeIsolation proves that a node identity can do what its agent needs with its
// own objects and is refused everything with another node's, while administrators are
// unaffected by the policy.
func TestNodeIsolation(t *testing.T) {
	install(t)
	admin := env.Client
	ctx := t.Context()
	forget(t, "mac-a", "mac-b")
	a, _ := issue(t, "mac-a")
	b, _ := issue(t, "mac-b")
	waitForPolicy(t, a)

	ns := testenv.NewNamespace(t, admin)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// mac-b registers itself, renews its Lease; the scheduler binds one replica to each
	// Mac and leaves one unbound.
	must(b.Create(ctx, macNode("mac-b")))
	must(b.Create(ctx, lease("mac-b")))
	for _, r := range []*v1alpha1.ModelReplica{replica(ns, "on-a", "mac-a"), replica(ns, "on-b", "mac-b"), replica(ns, "unbound", "")} {
		must(admin.Create(ctx, r))
	}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: "other"}, StringData: map[string]string{"k": "v"}}
	must(admin.Create(ctx, other))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), other) })

	const (
		policy = "denied request: " // how the API server prefixes a policy's message
		rbac   = `User "system:serviceaccount:macfleet-nodes:mac-a" cannot`
	)
	// Steps run in order: later ones rely on earlier ones (mac-a creates its MacNode
	// and Lease before it updates them).
	steps := []struct {
		name    string
		as      client.Client
		do      func(c client.Client) error
		wantErr []string // substrings of the 403; none means allowed
	}{
		{"create own MacNode", a, func(c client.Client) error { return c.Create(ctx, macNode("mac-a")) }, nil},
		{"relabel own MacNode with agent labels", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { n.Labels[v1alpha1.LabelMemoryGiB] = "96" })
		}, nil},
		{"update own MacNode status", a, func(c client.Client) error {
			return patchMacNodeStatus(ctx, c, "mac-a", func(n *v1alpha1.MacNode) {
				n.Status.Hardware.Chip = "Apple M2 Max"
				n.Status.Agent.Address = addrA
				n.Status.Conditions = []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady, LastTransitionTime: metav1.Now()}}
			})
		}, nil},
		{"admin cordons mac-a", admin, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = true; n.Labels["team"] = "research" })
		}, nil},
		{"full update of own MacNode keeping spec and admin labels", a, func(c client.Client) error {
			var n v1alpha1.MacNode
			if err := c.Get(ctx, client.ObjectKey{Name: "mac-a"}, &n); err != nil {
				return err
			}
			n.Labels["kubernetes.io/os"] = "darwin"
			return c.Update(ctx, &n)
		}, nil},
		{"uncordon own MacNode", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = false })
		}, []string{policy, "node mac-a may set the spec of its MacNode only when it creates it"}},
		{"raise own memory ceiling", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { n.Spec.MemoryCeiling = new(resource.MustParse("1Ti")) })
		}, []string{policy, "may set the spec of its MacNode only when it creates it"}},
		{"remove an admin label from own MacNode", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { delete(n.Labels, "team") })
		}, []string{policy, "node mac-a may only set the labels macfleet.dev/chip, macfleet.dev/memory-gib, kubernetes.io/arch, kubernetes.io/os on its MacNode, not team"}},
		{"add a label of its own choosing", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-a", func(n *v1alpha1.MacNode) { n.Labels["gpu"] = "huge" })
		}, []string{policy, "on its MacNode, not gpu"}},
		{"delete own MacNode", a, func(c client.Client) error { return c.Delete(ctx, macNode("mac-a")) },
			[]string{rbac, "delete"}},
		{"create own Lease", a, func(c client.Client) error { return c.Create(ctx, lease("mac-a")) }, nil},
		{"renew own Lease", a, func(c client.Client) error { return renewLease(ctx, c, "mac-a") }, nil},
		{"update status of replica bound to it", a, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "on-a", setReady)
		}, nil},
		{"read the fleet CA's key", a, func(c client.Client) error {
			return c.Get(ctx, client.ObjectKey{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.CASecret}, &corev1.Secret{})
		}, []string{rbac, "get", "secrets"}},
		{"read the retired fleet token", a, func(c client.Client) error {
			return c.Get(ctx, client.ObjectKey{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.FleetTokenSecret}, &corev1.Secret{})
		}, []string{rbac, "get", "secrets"}},
		{"record an event about its MacNode", a, func(c client.Client) error {
			return c.Create(ctx, nodeEvent("default", "mac-a.1", corev1.ObjectReference{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "MacNode", Name: "mac-a"}))
		}, nil},
		{"record an event about its replica in the tenant's namespace", a, func(c client.Client) error {
			return c.Create(ctx, nodeEvent(ns, "on-a.1", corev1.ObjectReference{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "ModelReplica", Namespace: ns, Name: "on-a"}))
		}, []string{policy, "node mac-a may only record Events about its own MacNode mac-a in namespace default, not events in namespace " + ns + " about ModelReplica " + ns + "/on-a"}},
		{"record an event about another MacNode", a, func(c client.Client) error {
			return c.Create(ctx, nodeEvent("default", "mac-b.1", corev1.ObjectReference{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "MacNode", Name: "mac-b"}))
		}, []string{policy, "not events in namespace default about MacNode mac-b"}},
		{"advertise another host as a replica's endpoint", a, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "on-a", setReadyAt("10.96.0.1:443"))
		}, []string{policy, "node mac-a may only advertise its own agent address in the status of a ModelReplica: " + ns +
			"/on-a says endpoint 10.96.0.1:443, but MacNode mac-a registered " + addrA}},

		{"ask what it may do (kubectl auth can-i)", a, func(c client.Client) error {
			r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "macfleet.dev", Resource: "macnodes", Verb: "update", Name: "mac-a"},
			}}
			if err := c.Create(ctx, r); err != nil {
				return err
			}
			if !r.Status.Allowed {
				return fmt.Errorf("RBAC says mac-a may not update MacNodes: %s", r.Status.Reason)
			}
			return nil
		}, nil},

		{"review a ServiceAccount token (the agent's OpenAI API)", a, func(c client.Client) error {
			return c.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: "not-a-token", Audiences: []string{"macfleet"}}})
		}, nil},

		{"create another node's MacNode", a, func(c client.Client) error { return c.Create(ctx, macNode("mac-c")) },
			[]string{policy, "node mac-a may only modify its own MacNode, not MacNode mac-c"}},
		{"update another node's MacNode", a, func(c client.Client) error {
			return patchMacNode(ctx, c, "mac-b", func(n *v1alpha1.MacNode) { n.Labels[v1alpha1.LabelChip] = "fake" })
		}, []string{policy, "node mac-a may only modify its own MacNode, not MacNode mac-b"}},
		{"update another node's MacNode status", a, func(c client.Client) error {
			return patchMacNodeStatus(ctx, c, "mac-b", func(n *v1alpha1.MacNode) { n.Status.Hardware.Chip = "fake" })
		}, []string{policy, "node mac-a may only modify its own MacNode, not MacNode mac-b"}},
		{"delete another node's MacNode", a, func(c client.Client) error { return c.Delete(ctx, macNode("mac-b")) },
			[]string{rbac, "delete"}},
		{"create another node's Lease", a, func(c client.Client) error { return c.Create(ctx, lease("mac-c")) },
			[]string{policy, "node mac-a may only hold its own Lease macfleet-node-lease/mac-a, not leases macfleet-node-lease/mac-c"}},
		{"renew another node's Lease", a, func(c client.Client) error { return renewLease(ctx, c, "mac-b") },
			[]string{policy, "not leases macfleet-node-lease/mac-b"}},
		{"hold a Lease elsewhere", a, func(c client.Client) error { return c.Create(ctx, newLease(ns, "mac-a")) },
			[]string{rbac, "create"}},
		{"update status of replica bound to another node", a, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "on-b", setReady)
		}, []string{policy, "node mac-a may only update the status of ModelReplicas bound to it; modelreplicas/status " + ns + "/on-b is bound to mac-b"}},
		{"update status of an unbound replica", a, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "unbound", setReady)
		}, []string{policy, "is bound to no node"}},
		{"delete a replica bound to it", a, func(c client.Client) error { return c.Delete(ctx, replica(ns, "on-a", "mac-a")) },
			[]string{rbac, "delete"}},
		{"rebind a replica", a, func(c client.Client) error {
			r := replica(ns, "rogue", "mac-a")
			return c.Create(ctx, r)
		}, []string{rbac, "create"}},
		{"read another Secret", a, func(c client.Client) error {
			return c.Get(ctx, client.ObjectKeyFromObject(other), &corev1.Secret{})
		}, []string{rbac, "get"}},
		{"create a ModelDeployment", a, func(c client.Client) error {
			return c.Create(ctx, &v1alpha1.ModelDeployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine"},
				Spec:       v1alpha1.ModelDeploymentSpec{Model: v1alpha1.ModelSource{Source: "file:///models/qwen.gguf"}},
			})
		}, []string{rbac, "create"}},
		{"read the namespaces' FleetQuotas", a, func(c client.Client) error {
			return c.List(ctx, &v1alpha1.FleetQuotaList{}, client.InNamespace(ns))
		}, []string{rbac, "list"}},
		{"give a namespace more fleet memory", a, func(c client.Client) error {
			return c.Create(ctx, &v1alpha1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "more"},
				Spec: v1alpha1.FleetQuotaSpec{Memory: resource.MustParse("1Ti")}})
		}, []string{rbac, "create"}},

		{"mac-b registers mac-a's address", b, func(c client.Client) error {
			return patchMacNodeStatus(ctx, c, "mac-b", func(n *v1alpha1.MacNode) { n.Status.Agent.Address = addrA })
		}, []string{policy, "node mac-b may not register the agent address " + addrA + ": it is the address of MacNode mac-a"}},
		{"mac-b updates its own MacNode status", b, func(c client.Client) error {
			return patchMacNodeStatus(ctx, c, "mac-b", func(n *v1alpha1.MacNode) {
				n.Status.Hardware.Chip = "Apple M1"
				n.Status.Agent.Address = addrB
			})
		}, nil},
		{"mac-b updates status of replica bound to it", b, func(c client.Client) error {
			return retryUntilParamSeen(ctx, func() error { return patchReplicaStatus(ctx, c, ns, "on-b", setReadyAt(addrB)) })
		}, nil},
		{"mac-b updates status of replica bound to mac-a", b, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "on-a", func(r *v1alpha1.ModelReplica) {
				r.Status.Phase, r.Status.Endpoint = v1alpha1.ReplicaFailed, addrB
			})
		}, []string{policy, "node mac-b may only update the status of ModelReplicas bound to it"}},

		{"admin updates the status of a replica bound to mac-a", admin, func(c client.Client) error {
			return patchReplicaStatus(ctx, c, ns, "on-a", func(r *v1alpha1.ModelReplica) { r.Status.Phase = v1alpha1.ReplicaDraining })
		}, nil},
		{"admin updates mac-b's MacNode and Lease", admin, func(c client.Client) error {
			if err := patchMacNode(ctx, c, "mac-b", func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = true }); err != nil {
				return err
			}
			return renewLease(ctx, c, "mac-b")
		}, nil},
		{"admin deletes a replica", admin, func(c client.Client) error { return c.Delete(ctx, replica(ns, "unbound", "")) }, nil},
	}
	for _, s := range steps {
		err := s.do(s.as)
		switch {
		case len(s.wantErr) == 0 && err != nil:
			t.Errorf("%s: %v", s.name, err)
		case len(s.wantErr) > 0 && !apierrors.IsForbidden(err):
			t.Errorf("%s: got %v, want 403 Forbidden", s.name, errString(err))
		case len(s.wantErr) > 0:
			for _, w := range s.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q lacks %q", s.name, err, w)
				}
			}
		}
	}

	// What the refused writes would have changed is unchanged.
	var nb v1alpha1.MacNode
	must(admin.Get(ctx, client.ObjectKey{Name: "mac-b"}, &nb))
	if nb.Labels[v1alpha1.LabelChip] != "Apple-M2-Max" || nb.Status.Hardware.Chip != "Apple M1" {
		t.Errorf("MacNode mac-b: chip label %q, status chip %q; want Apple-M2-Max, Apple M1 (mac-a's writes refused)",
			nb.Labels[v1alpha1.LabelChip], nb.Status.Hardware.Chip)
	}
	var na v1alpha1.MacNode
	must(admin.Get(ctx, client.ObjectKey{Name: "mac-a"}, &na))
	if diff := cmp.Diff(map[string]string{
		v1alpha1.LabelChip: "Apple-M2-Max", v1alpha1.LabelMemoryGiB: "96", "kubernetes.io/arch": "arm64", "kubernetes.io/os": "darwin", "team": "research",
	}, na.Labels); diff != "" {
		t.Errorf("MacNode mac-a labels (-want +got):\n%s", diff)
	}
	if !na.Spec.Unschedulable || na.Spec.MemoryCeiling != nil {
		t.Errorf("MacNode mac-a spec = %+v, want the admin's cordon and no ceiling", na.Spec)
	}
	var onB v1alpha1.ModelReplica
	must(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "on-b"}, &onB))
	if onB.Status.Phase != v1alpha1.ReplicaRunning {
		t.Errorf("replica on-b phase = %q, want %q (mac-b's write, not mac-a's)", onB.Status.Phase, v1alpha1.ReplicaRunning)
	}
}

// TestNodeCanCreateItselfWithSpec: an agent may set its MacNode's spec when it creates
// it (the spec freeze applies to updates), but not labels other than its own, nor the
// operator's bound spec.memoryCeiling.
func TestNodeCanCreateItselfWithSpec(t *testing.T) {
	install(t)
	forget(t, "mac-spec")
	c, _ := issue(t, "mac-spec")
	waitForPolicy(t, c)
	n := macNode("mac-spec")
	n.Spec.Unschedulable = true
	withCeiling := n.DeepCopy()
	withCeiling.Spec.MemoryCeiling = new(resource.MustParse("1Ti"))
	err := c.Create(t.Context(), withCeiling, client.DryRunAll)
	if want := "may not set spec.memoryCeiling of its MacNode"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("creating own MacNode with a memory ceiling: got %s, want 403 with %q", errString(err), want)
	}
	withTeam := n.DeepCopy()
	withTeam.Labels["team"] = "x"
	err = c.Create(t.Context(), withTeam, client.DryRunAll)
	if want := "on its MacNode, not team"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("creating own MacNode with an admin's label: got %s, want 403 with %q", errString(err), want)
	}
	if err := c.Create(t.Context(), n); err != nil {
		t.Fatalf("creating own MacNode with a spec: %v", err)
	}
}

// TestAdminUnaffected: the policy's matchConditions leave other identities alone,
// including other service accounts with the same RBAC.
func TestAdminUnaffected(t *testing.T) {
	install(t)
	forget(t, "admin-made")
	a, _ := issue(t, "mac-x")
	waitForPolicy(t, a)
	ctx := t.Context()
	// An administrator can do all that the policy refuses a node.
	n := macNode("admin-made")
	n.Labels["team"] = "y"
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = true
	delete(n.Labels, "team")
	if err := env.Client.Update(ctx, n); err != nil {
		t.Fatalf("admin updating a MacNode's spec and labels: %v", err)
	}
	if err := env.Client.Delete(ctx, n); err != nil {
		t.Fatalf("admin deleting a MacNode: %v", err)
	}
	if err := env.Client.Create(ctx, newLease(v1alpha1.NodeLeaseNamespace, "admin-made")); err != nil {
		t.Fatalf("admin creating a Lease: %v", err)
	}
}

func TestValidateNodeName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string
	}{
		{"mac-studio-1", ""},
		{"m2.max.lab", ""},
		{"", "a node name is required"},
		{"Mac_Studio", `invalid node name "Mac_Studio": it names a MacNode and a ServiceAccount, so a lowercase RFC 1123 subdomain`},
		{"-mac", "lowercase RFC 1123 subdomain"},
		{strings.Repeat("a", 254), "must be no more than 253 characters"},
		{"default", "shared by every pod"},
	}
	for _, tt := range tests {
		err := credentials.ValidateNodeName(tt.name)
		if got := errString(err); tt.wantErr == "" && err != nil || tt.wantErr != "" && !strings.Contains(got, tt.wantErr) {
			t.Errorf("ValidateNodeName(%q) = %s, want error containing %q", tt.name, got, tt.wantErr)
		}
	}
}

func TestIssueRejectsBadInput(t *testing.T) {
	install(t)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tests := []struct {
		name, node string
		opts       credentials.Options
		wantErr    string
	}{
		{"bad name", "Mac_A", credentials.Options{}, `invalid node name "Mac_A"`},
		{"short duration", "mac-a", credentials.Options{Duration: time.Minute}, "token duration 1m0s is too short"},
		{"a year", "mac-a", credentials.Options{Duration: 365 * 24 * time.Hour}, "token duration 8760h0m0s is too long: a node token lasts at most 48h0m0s"},
		{"bad server", "mac-a", credentials.Options{Server: "ftp://x"}, `invalid API server URL "ftp://x"`},
	}
	for _, tt := range tests {
		_, err := credentials.Issue(t.Context(), cs, env.Config, tt.node, tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: Issue = %v, want error containing %q", tt.name, err, tt.wantErr)
		}
	}
	var sa corev1.ServiceAccount
	err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: "Mac_A"}, &sa)
	if !apierrors.IsNotFound(err) {
		t.Errorf("ServiceAccount for a rejected name: got %v, want NotFound", errString(err))
	}
}

// TestIssueKubeconfig checks what goes into the kubeconfig: the server (the caller's or
// --server), the caller's CA, the node's namespace, and a token of the asked lifetime.
func TestIssueKubeconfig(t *testing.T) {
	install(t)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	start := time.Now()
	cred, err := credentials.Issue(t.Context(), cs, env.Config, "mac-kc", credentials.Options{Duration: 2 * time.Hour, Server: "https://fleet.example.com:6443/"})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cur := kc.Contexts[kc.CurrentContext]
	if cur == nil {
		t.Fatalf("kubeconfig has no current context %q", kc.CurrentContext)
	}
	type summary struct{ Server, Namespace string }
	if diff := cmp.Diff(summary{"https://fleet.example.com:6443", v1alpha1.NodeLeaseNamespace},
		summary{kc.Clusters[cur.Cluster].Server, cur.Namespace}); diff != "" {
		t.Errorf("kubeconfig (-want +got):\n%s", diff)
	}
	if string(kc.Clusters[cur.Cluster].CertificateAuthorityData) != string(env.Config.CAData) {
		t.Error("kubeconfig's CA differs from the caller's")
	}
	if lo, hi := start.Add(2*time.Hour-time.Minute), time.Now().Add(2*time.Hour+time.Minute); cred.Expires.Before(lo) || cred.Expires.After(hi) {
		t.Errorf("token expires %v, want about 2h from %v", cred.Expires, start)
	}
	if len(cred.Warnings) != 0 {
		t.Errorf("warnings with RBAC and policy installed: %q", cred.Warnings)
	}

	// The token authenticates as the node's ServiceAccount.
	rc := rest.CopyConfig(env.Config)
	rc.BearerToken = kc.AuthInfos[cur.AuthInfo].Token
	rc.CertData, rc.KeyData = nil, nil
	who, err := kubernetes.NewForConfigOrDie(rc).AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("whoami with the node token: %v", err)
	}
	if got, want := who.Status.UserInfo.Username, "system:serviceaccount:macfleet-nodes:mac-kc"; got != want {
		t.Errorf("node token authenticates as %q, want %q", got, want)
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.kubeconfig")
	// A file left with wide permissions is replaced, not rewritten in place.
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := credentials.WriteFile(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("content %q, want %q", b, "new")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the kubeconfig (no temporary file left)", len(entries))
	}
	if err := credentials.WriteFile(filepath.Join(t.TempDir(), "missing", "x"), nil); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}

// TestPolicyBeyondRBAC grants a node identity more than config/agent does, as a careless
// administrator might, and shows that the policy still confines it.
func TestPolicyBeyondRBAC(t *testing.T) {
	install(t)
	ctx := t.Context()
	admin := env.Client
	forget(t, "mac-r")
	c, _ := issue(t, "mac-r")
	waitForPolicy(t, c)
	ns := testenv.NewNamespace(t, admin)
	user := "system:serviceaccount:macfleet-nodes:mac-r"
	broad := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "too-broad-mac-r"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"macnodes", "modelreplicas"}, Verbs: []string{"*"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "too-broad-mac-r"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: broad.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, o := range []client.Object{broad, binding, replica(ns, "on-r", "mac-r")} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), binding)
		_ = admin.Delete(context.Background(), broad)
	})
	if err := c.Create(ctx, macNode("mac-r")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		do   func() error
		want string
	}{
		{"delete own MacNode", func() error { return c.Delete(ctx, macNode("mac-r")) },
			"node mac-r may not delete its MacNode: an administrator removes a Mac from the fleet"},
		{"relabel a replica bound to it", func() error {
			var r v1alpha1.ModelReplica
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "on-r"}, &r); err != nil {
				return err
			}
			before := r.DeepCopy()
			r.Labels["x"] = "y"
			return c.Patch(ctx, &r, client.MergeFrom(before))
		}, "node mac-r may only update the status of ModelReplicas bound to it, not update modelreplicas " + ns + "/on-r"},
		{"delete a replica bound to it", func() error { return c.Delete(ctx, replica(ns, "on-r", "mac-r")) },
			"not delete modelreplicas " + ns + "/on-r"},
		{"create a replica", func() error { return c.Create(ctx, replica(ns, "extra", "mac-r")) },
			"not create modelreplicas " + ns + "/extra"},
		{"create a ConfigMap", func() error {
			return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm"}})
		}, "node mac-r may only modify its own MacNode, its own Lease in macfleet-node-lease and the status of ModelReplicas bound to it, not create configmaps " + ns + "/cm"},
	}
	// RBAC changes reach the authorizer through an informer: wait until mac-r may
	// create ConfigMaps as far as RBAC goes, i.e. the refusal comes from the policy.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := tests[len(tests)-1].do()
		return err != nil && strings.Contains(err.Error(), "denied request"), "ConfigMap create: " + errString(err)
	})
	for _, tt := range tests {
		err := tt.do()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "denied request: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %s, want 403 with %q", tt.name, errString(err), tt.want)
		}
	}
}

// nodeEvent is a core Event about ref, as a node's recorder would write it.
func nodeEvent(ns, name string, ref corev1.ObjectReference) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: name},
		InvolvedObject: ref,
		Reason:         "Loaded", Message: "model loaded", Type: corev1.EventTypeNormal,
	}
}
