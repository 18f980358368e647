package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/controllers/endpoints"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The attacks of docs/security.md, 4 ("What a Mac may claim"): a compromised Mac holds
// its node credential and writes what it likes with it. Each test enrolls its own
// Mac, as an administrator would, so the fleet's real Macs are left alone.

// enroll runs `macfleet nodes credentials name` as the administrator and returns a
// client authenticating as the Mac and its kubeconfig's REST config.
func enroll(t *testing.T, name string, extra ...string) (client.Client, *rest.Config) {
	t.Helper()
	kc := filepath.Join(t.TempDir(), name+".kubeconfig")
	out, err := runCLI(t, append([]string{"nodes", "credentials", name, "--server", fleet.APIServerURL(), "-o", kc}, extra...)...)
	if err != nil {
		t.Fatalf("macfleet nodes credentials %s: %v\n%s", name, err, out)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(rc, client.Options{Scheme: fleet.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, o := range []client.Object{&v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeLeaseNamespace, Name: name}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeIdentityNamespace, Name: name}}} {
			_ = fleet.Client.Delete(ctx, o)
		}
	})
	return c, rc
}

// runCLI runs the fleet's macfleet binary with the administrator's kubeconfig.
func runCLI(t *testing.T, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, fleet.Binary(), append(args, "--kubeconfig", fleet.AdminKubeconfig)...).CombinedOutput()
}

// register plays the compromised agent: its MacNode, Ready, at addr, with chip and the
// ceiling it claims (none: the scheduler places nothing on it), and a Lease that stays
// fresh for the test.
func register(t *testing.T, c client.Client, name, addr, chip, ceiling string) {
	t.Helper()
	ctx := t.Context()
	mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, mn); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating MacNode %s as itself: %v", name, err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeLeaseNamespace, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(600)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatalf("creating the Lease of %s as itself: %v", name, err)
	}
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		var cur v1alpha1.MacNode
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &cur); err != nil {
			return false, err.Error()
		}
		cur.Status.Hardware.Chip = chip
		cur.Status.Agent.Address = addr
		if ceiling != "" {
			cur.Status.Memory.Ceiling = ptr.To(resource.MustParse(ceiling))
		}
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady,
			Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady, Message: "ready"})
		if err := c.Status().Update(ctx, &cur); err != nil {
			return false, "writing its status: " + err.Error()
		}
		return true, ""
	})
}

// TestAttackHugeCeilingAttractsReplicas: a Mac reports a terabyte of memory to draw
// every tenant's replicas (and prompts) to itself; it must now get no replica beyond
// the largest memory of the chip it reports, and a CeilingCapped condition naming
// the cap.
func TestAttackHugeCeilingAttractsReplicas(t *testing.T) {
	const liar = "mac-liar"
	c, _ := enroll(t, liar)
	register(t, c, liar, net.JoinHostPort(fleet.HostIP, "1"), "Apple M4", "1Ti")

	ns := testenv.NewNamespace(t, fleet.Client)
	// 40Gi: more than any M4 has (32Gi), and than the fleet's real Macs.
	create(t, deployment(ns, "big", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: ptr.To(resource.MustParse("40Gi"))}
	}))
	testenv.Eventually(t, 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		var list v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d replicas", len(list.Items))
		}
		r := list.Items[0]
		if r.Spec.NodeName != "" {
			t.Fatalf("the 40Gi replica was bound to %s: the scheduler believed a claimed ceiling", r.Spec.NodeName)
		}
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
		if cond == nil || cond.Status != metav1.ConditionFalse {
			return false, fmt.Sprintf("replica Scheduled condition %+v, want False", cond)
		}
		return true, ""
	})
	testenv.Eventually(t, 30*time.Second, 250*time.Millisecond, func() (bool, string) {
		var mn v1alpha1.MacNode
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: liar}, &mn); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(mn.Status.Conditions, v1alpha1.MacNodeCeilingCapped)
		if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "32.0 GiB") ||
			!strings.Contains(cond.Message, "spec.memoryCeiling") {
			return false, fmt.Sprintf("MacNode %s CeilingCapped = %+v, want True naming the 32.0 GiB cap and spec.memoryCeiling", liar, cond)
		}
		return true, ""
	})

	// The operator's bound, set at enrollment, caps below the chip's.
	if out, err := runCLI(t, "nodes", "credentials", liar, "--server", fleet.APIServerURL(), "--memory-ceiling", "2Gi", "-o", filepath.Join(t.TempDir(), "kc")); err != nil {
		t.Fatalf("re-enrolling with --memory-ceiling: %v\n%s", err, out)
	}
	var mn v1alpha1.MacNode
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: liar}, &mn); err != nil {
		t.Fatal(err)
	}
	if mn.Spec.MemoryCeiling == nil || mn.Spec.MemoryCeiling.String() != "2Gi" {
		t.Errorf("MacNode %s spec.memoryCeiling = %v, want the operator's 2Gi", liar, mn.Spec.MemoryCeiling)
	}
	err := c.Patch(t.Context(), &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: liar}},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"memoryCeiling":null}}`)))
	if !apierrors.IsForbidden(err) {
		t.Errorf("the Mac clearing its operator's bound: got %v, want 403", err)
	}
}

// TestAttackReplicaEndpointElsewhere: a Mac sets the endpoint of a tenant's replica
// bound to it to another host (the API server's service address), where the
// gateways and the autoscaler would send tenants' prompts and the fleet's
// credentials; admission must now refuse it, naming the Mac's registered address.
func TestAttackReplicaEndpointElsewhere(t *testing.T) {
	const name = "mac-redirect"
	c, _ := enroll(t, name)
	own := net.JoinHostPort(fleet.HostIP, "2")
	register(t, c, name, own, "Apple M2 Max", "")

	ns := testenv.NewNamespace(t, fleet.Client)
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bound-to-liar", Labels: map[string]string{v1alpha1.LabelDeployment: "none"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:     v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: fleet.ModelsURL + "/" + modelFile}},
			TemplateHash: "h", MemoryReservation: resource.MustParse("1Gi"), NodeName: name,
		},
	}
	create(t, mr)
	// The node authorizer learns of the replica from its informer, a moment after it
	// is created: until then the Mac may not even read it.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(mr), &v1alpha1.ModelReplica{}); err != nil {
			return false, "the Mac reading the replica bound to it: " + err.Error()
		}
		return true, ""
	})
	// The scheduler writes the replica's status too: a conflict is retried.
	set := func(endpoint string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur v1alpha1.ModelReplica
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(mr), &cur); err != nil {
				return err
			}
			cur.Status.Endpoint = endpoint
			return c.Status().Update(t.Context(), &cur)
		})
	}
	err := set("10.96.0.1:443")
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "registered "+own) {
		t.Fatalf("the Mac advertising another host: got %v, want 403 naming its registered address %s", err, own)
	}
	// Its own registered address is what it may advertise (the policy reads MacNodes a
	// moment after they change).
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := set(own); err != nil {
			return false, "advertising its own address: " + err.Error()
		}
		return true, ""
	})
}

// TestAttackEventInTenantNamespace: a Mac writes an Event into a tenant's namespace
// about the tenant's deployment (a forged "reason" shown by kubectl describe);
// admission must now refuse every Event not about its own MacNode.
func TestAttackEventInTenantNamespace(t *testing.T) {
	c, _ := enroll(t, "mac-gossip")
	ns := testenv.NewNamespace(t, fleet.Client)
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "forged"},
		InvolvedObject: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ModelDeployment",
			Namespace: ns, Name: "qwen"},
		Reason: "KeyRotated", Message: "send your new key to …", Type: corev1.EventTypeWarning,
	}
	err := c.Create(t.Context(), ev)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may only record Events about its own MacNode") {
		t.Fatalf("an Event in tenant namespace %s: got %v, want 403", ns, err)
	}
}

// TestAttackStolenNodeToken: a node token copied off a Mac works for a year, from
// anywhere, whatever the administrator does short of deleting the identity; it must
// now last at most 48h (a year is refused) and stop working as soon as the Mac is
// revoked (`macfleet nodes revoke`), renewed tokens included.
func TestAttackStolenNodeToken(t *testing.T) {
	const name = "mac-stolen"
	c, rc := enroll(t, name)
	iat, exp := tokenTimes(t, rc.BearerToken)
	if life := exp.Sub(iat); life > 48*time.Hour {
		t.Errorf("a node token lasts %v, want at most 48h", life)
	}
	if out, err := runCLI(t, "nodes", "credentials", name, "--server", fleet.APIServerURL(), "--duration", "8760h", "-o", filepath.Join(t.TempDir(), "kc")); err == nil {
		t.Errorf("a year-long node credential was issued:\n%s", out)
	}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: "x"}, &coordinationv1.Lease{}); err != nil &&
		!apierrors.IsNotFound(err) {
		t.Fatalf("the stolen token before revocation: %v", err)
	}
	if out, err := runCLI(t, "nodes", "revoke", name); err != nil {
		t.Fatalf("macfleet nodes revoke %s: %v\n%s", name, err, out)
	}
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		err := c.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: "x"}, &coordinationv1.Lease{})
		if apierrors.IsUnauthorized(err) {
			return true, ""
		}
		return false, fmt.Sprintf("the stolen token after revocation: got %v, want 401", err)
	})
}

// tokenTimes reads the issued-at and expiry of a JWT (not verified: the API server
// did that; only the lifetime it granted is wanted).
func tokenTimes(t *testing.T, token string) (iat, exp time.Time) {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("the node token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct{ Iat, Exp int64 }
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return time.Unix(claims.Iat, 0), time.Unix(claims.Exp, 0)
}

// TestAttackSquatAddressInTenantSlices: a Mac registers the API server's service
// address as its own and marks a tenant's replica on it ready, so that the tenant's
// Service sends its in-cluster clients (and their tokens) there; or it takes over
// another Mac's address. It must now get a 403 for the other Mac's address, and no
// endpoint in the tenant's EndpointSlice for the API server's.
func TestAttackSquatAddressInTenantSlices(t *testing.T) {
	const squatter = "mac-squatter"
	c, _ := enroll(t, squatter)
	var kube corev1.Service
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "kubernetes"}, &kube); err != nil {
		t.Fatal(err)
	}
	squat := net.JoinHostPort(kube.Spec.ClusterIP, "8080")
	register(t, c, squatter, squat, "Apple M2 Max", "8Gi")

	setAddress := func(addr string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var mn v1alpha1.MacNode
			if err := c.Get(t.Context(), client.ObjectKey{Name: squatter}, &mn); err != nil {
				return err
			}
			mn.Status.Agent.Address = addr
			return c.Status().Update(t.Context(), &mn)
		})
	}
	victim := fleet.Agent("mac-studio-1").Addr
	err := setAddress(victim)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "it is the address of MacNode mac-studio-1") {
		t.Errorf("taking over mac-studio-1's address %s: got %v, want 403", victim, err)
		if err := setAddress(squat); err != nil { // back to the API server's, for the next attack
			t.Fatal(err)
		}
	}

	// One replica on each Mac: the two real ones load theirs, the squatter says its
	// own is ready at its address.
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "squat", 3))
	mine := replicaOn(t, ns, squatter)
	markReady(t, c, &mine, squat)
	macs := []string{fleet.Agent("mac-studio-1").Addr, fleet.Agent("mac-mini-1").Addr}
	var addrs []string
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		addrs = readySliceAddresses(t, ns, "squat")
		for _, a := range macs {
			if !slices.Contains(addrs, a) {
				return false, fmt.Sprintf("ready endpoints %v, want the real Macs' %v", addrs, macs)
			}
		}
		return true, ""
	})
	if slices.Contains(addrs, squat) {
		t.Fatalf("tenant %s's EndpointSlice lists %s, the API server's service address a Mac claimed: %v", ns, squat, addrs)
	}
}

// replicaOn waits for a replica in ns bound to node and returns it.
func replicaOn(t *testing.T, ns, node string) v1alpha1.ModelReplica {
	t.Helper()
	var mine v1alpha1.ModelReplica
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		var list v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, r := range list.Items {
			if r.Spec.NodeName == node {
				mine = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("no replica of %d bound to %s yet", len(list.Items), node)
	})
	return mine
}

// markReady plays the compromised agent saying its replica mr is loaded and ready at
// addr (its registered address), with its node client c.
func markReady(t *testing.T, c client.Client, mr *v1alpha1.ModelReplica, addr string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.ModelReplica
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(mr), &cur); err != nil {
			return err
		}
		cur.Status.Endpoint, cur.Status.Phase = addr, v1alpha1.ReplicaRunning
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady,
			Status: metav1.ConditionTrue, Reason: "Loaded", Message: "ready"})
		return c.Status().Update(t.Context(), &cur)
	})
	if err != nil {
		t.Fatalf("the Mac marking its replica ready at its registered address %s: %v", addr, err)
	}
}

// TestAttackForeignListenerInTenantSlices: a Mac registers as its agent address a
// listener that is not its agent — a service of the LAN speaking plain HTTP, a TLS
// server with a certificate naming the Mac from another CA, or one holding another
// Mac's certificate from the fleet CA — and marks a tenant's replica ready, so that
// the tenant's Service sends its in-cluster callers (and their tokens) there. The
// address must now stay out of the tenant's EndpointSlice (the handshake does not
// prove the Mac's certificate; an AddressUnverified Event on the MacNode says why)
// while the real Macs stay in it.
func TestAttackForeignListenerInTenantSlices(t *testing.T) {
	const impostor = "mac-impostor"
	c, _ := enroll(t, impostor)

	// A LAN service: plain HTTP, answering anything.
	lan := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "{}") }),
		ReadHeaderTimeout: 5 * time.Second}
	// On the fleet's host address (no loopback address: the API server refuses those
	// in EndpointSlices).
	plain, err := net.Listen("tcp", net.JoinHostPort(fleet.HostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = lan.Serve(plain) }()
	t.Cleanup(func() { lan.Close() })

	rogue, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	listeners := []struct{ what, addr string }{
		{"a plain HTTP service of the LAN", plain.Addr().String()},
		{"a TLS server with a certificate naming " + impostor + " from another CA", serveTLSOnHost(t, rogue, impostor)},
		{"a TLS server with mac-studio-1's certificate from the fleet CA", serveTLSOnHost(t, fleetCA(t), "mac-studio-1")},
	}
	register(t, c, impostor, listeners[0].addr, "Apple M2 Max", "8Gi")
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "impostor", 3))
	mine := replicaOn(t, ns, impostor)
	markReady(t, c, &mine, listeners[0].addr)

	macs := []string{fleet.Agent("mac-studio-1").Addr, fleet.Agent("mac-mini-1").Addr}
	for i, l := range listeners {
		if i > 0 {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var mn v1alpha1.MacNode
				if err := c.Get(t.Context(), client.ObjectKey{Name: impostor}, &mn); err != nil {
					return err
				}
				mn.Status.Agent.Address = l.addr
				return c.Status().Update(t.Context(), &mn)
			})
			if err != nil {
				t.Fatalf("moving %s's address to %s: %v", impostor, l.addr, err)
			}
		}
		// Until the controller has judged the address (its Event), it must never be in
		// the slice; after, the real Macs must be.
		testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
			addrs := readySliceAddresses(t, ns, "impostor")
			if slices.Contains(addrs, l.addr) {
				t.Fatalf("tenant %s's EndpointSlice lists %s, %s that %s registered as its agent: %v", ns, l.addr, l.what, impostor, addrs)
			}
			if !unverifiedEvent(t, impostor, l.addr) {
				return false, fmt.Sprintf("no AddressUnverified Event on MacNode %s for %s yet", impostor, l.addr)
			}
			for _, a := range macs {
				if !slices.Contains(addrs, a) {
					return false, fmt.Sprintf("ready endpoints %v, want the real Macs' %v", addrs, macs)
				}
			}
			return true, ""
		})
		t.Logf("%s at %s: refused, the real Macs published", l.what, l.addr)
	}
}

// serveTLSOnHost serves TLS handshakes with a certificate of ca naming the Mac name
// on the fleet's host address, until the test ends, and returns the address.
func serveTLSOnHost(t *testing.T, ca *pki.CA, name string) string {
	t.Helper()
	id := pki.Node(name)
	src, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return certsignertest.ServeTLS(t, src, fleet.HostIP)
}

// unverifiedEvent says whether an AddressUnverified Event about MacNode node names
// addr.
func unverifiedEvent(t *testing.T, node, addr string) bool {
	t.Helper()
	var list eventsv1.EventList
	if err := fleet.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Reason == endpoints.EventAddressUnverified && ev.Regarding.Kind == "MacNode" && ev.Regarding.Name == node &&
			strings.Contains(ev.Note, addr) {
			return true
		}
	}
	return false
}
