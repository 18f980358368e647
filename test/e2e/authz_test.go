package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var (
	replicasGVR    = v1alpha1.GroupVersion.WithResource("modelreplicas")
	deploymentsGVR = v1alpha1.GroupVersion.WithResource("modeldeployments")
)

// TestNodeCredentialReadsOnlyItsReplicas: with the node authorizer in the API server's
// chain (internal/nodeauthz, config/authorization), a Mac's credential reads the
// replicas bound to that Mac — the field-selected list and watch its agent runs, gets
// of one replica and its status — and gets a 403 for everything else: all replicas,
// another Mac's, and ModelDeployments anywhere.
func TestNodeCredentialReadsOnlyItsReplicas(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	md := deployment(ns, "tenant", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: ptr.To(resource.MustParse("256Mi"))}
	})
	create(t, md)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := fleet.Client.Delete(ctx, md); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting deployment %s/%s: %v", ns, md.Name, err)
		}
	})
	mine, theirs := boundPair(t, ns, "tenant", localfleetNode(0))
	node := localfleetNode(0)
	dc := nodeDynamicClient(t, node)
	ctx := t.Context()

	ownSelector := fields.OneTermEqualSelector(v1alpha1.ReplicaNodeNameField, node).String()
	otherSelector := fields.OneTermEqualSelector(v1alpha1.ReplicaNodeNameField, theirs.Spec.NodeName).String()
	forbidden := []struct {
		what string
		do   func() error
	}{
		{"list every replica", func() error { _, err := dc.Resource(replicasGVR).List(ctx, metav1.ListOptions{}); return err }},
		{"list the namespace's replicas", func() error {
			_, err := dc.Resource(replicasGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list another Mac's replicas", func() error {
			_, err := dc.Resource(replicasGVR).List(ctx, metav1.ListOptions{FieldSelector: otherSelector})
			return err
		}},
		{"watch every replica", func() error {
			w, err := dc.Resource(replicasGVR).Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"get another Mac's replica", func() error {
			_, err := dc.Resource(replicasGVR).Namespace(ns).Get(ctx, theirs.Name, metav1.GetOptions{})
			return err
		}},
		{"get another Mac's replica's status", func() error {
			_, err := dc.Resource(replicasGVR).Namespace(ns).Get(ctx, theirs.Name, metav1.GetOptions{}, "status")
			return err
		}},
		{"list every ModelDeployment", func() error {
			_, err := dc.Resource(deploymentsGVR).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list the namespace's ModelDeployments", func() error {
			_, err := dc.Resource(deploymentsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get its replica's ModelDeployment", func() error {
			_, err := dc.Resource(deploymentsGVR).Namespace(ns).Get(ctx, md.Name, metav1.GetOptions{})
			return err
		}},
	}
	for _, f := range forbidden {
		if err := f.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s with %s's credential: %v, want 403 Forbidden", f.what, node, err)
		}
	}

	// What its agent does: list and watch its replicas, get one (after a conflict).
	list, err := dc.Resource(replicasGVR).List(ctx, metav1.ListOptions{FieldSelector: ownSelector})
	if err != nil {
		t.Fatalf("%s listing its replicas: %v", node, err)
	}
	found := false
	for _, it := range list.Items {
		found = found || it.GetNamespace() == ns && it.GetName() == mine.Name
		if n, _, _ := unstructured.NestedString(it.Object, "spec", "nodeName"); n != node {
			t.Errorf("%s's list holds %s/%s of node %q", node, it.GetNamespace(), it.GetName(), n)
		}
	}
	if !found {
		t.Errorf("%s's list lacks its replica %s/%s", node, ns, mine.Name)
	}
	// A watch from resourceVersion 0 starts with the replicas it selects.
	w, err := dc.Resource(replicasGVR).Watch(ctx, metav1.ListOptions{FieldSelector: ownSelector, ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("%s watching its replicas: %v", node, err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added {
			t.Errorf("first event of %s's watch: %s %v", node, ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s's watch sent no event within 30s", node)
	}
	w.Stop()
	// The manager's cache, which the authorizer reads, may trail the binding we saw.
	for _, sub := range [][]string{nil, {"status"}} {
		testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
			_, err := dc.Resource(replicasGVR).Namespace(ns).Get(ctx, mine.Name, metav1.GetOptions{}, sub...)
			return err == nil, fmt.Sprintf("%s getting its replica %s/%s %v: %v", node, ns, mine.Name, sub, err)
		})
	}

	// And the agents, reading with these rules, load their replicas.
	waitReady(t, ns, "tenant", 2, 3*time.Minute)
}

// boundPair waits until the deployment's two replicas are bound, one to node and one
// to another Mac, and returns them in that order.
func boundPair(t *testing.T, ns, name, node string) (mine, theirs v1alpha1.ModelReplica) {
	t.Helper()
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		var list v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns),
			client.MatchingLabels{v1alpha1.LabelDeployment: name}); err != nil {
			return false, err.Error()
		}
		var gotMine, gotTheirs bool
		for _, r := range list.Items {
			switch r.Spec.NodeName {
			case node:
				mine, gotMine = r, true
			case "":
			default:
				theirs, gotTheirs = r, true
			}
		}
		return gotMine && gotTheirs, fmt.Sprintf("want one replica on %s and one elsewhere:%s", node, describeReplicas(list.Items))
	})
	return mine, theirs
}

// nodeDynamicClient reaches the API server with a Mac's node credential.
func nodeDynamicClient(t testing.TB, node string) *dynamic.DynamicClient {
	t.Helper()
	a := fleet.Agent(node)
	if a == nil {
		t.Fatalf("no agent %s", node)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}
