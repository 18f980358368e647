package clustermode_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// createSplit creates a replica bound as a gang of head and worker, labelled for the
// worker's Mac as the scheduler does.
func createSplit(t *testing.T, ns, name, head, worker string) {
	t.Helper()
	mr := newReplicaObject(ns, name, head)
	mr.Labels[v1alpha1.ShardLabel(worker)] = v1alpha1.ShardLabelWorker
	mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: head, FirstLayer: 0, LastLayer: 0, Memory: resource.MustParse("256Mi")},
		{Node: worker, FirstLayer: 1, LastLayer: 1, Memory: resource.MustParse("256Mi")},
	}}
	if err := env.Client.Create(t.Context(), mr); err != nil {
		t.Fatalf("creating replica %s: %v", name, err)
	}
}

// TestAgentFindsItsWorkerShards: the cluster agent of a Mac holding a worker shard of a
// split replica finds the replica by its worker label (the head's Mac is another) and
// lets only the head's Mac open the split link to it, over mutual TLS; a replica whose
// worker shard is on another Mac is unknown to it.
func TestAgentFindsItsWorkerShards(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	head := fmt.Sprintf("mac-head-%d", nodeSeq.Add(1))
	createSplit(t, ns, "big-0", head, a.node)
	createSplit(t, ns, "far-0", head, "mac-elsewhere")
	dial := func(id pki.Identity, name string) error {
		c, err := splitlink.Dial(t.Context(), a.endpoint, source(t, &id).ClientConfig(pki.Node(a.node)), ns, name)
		if err == nil {
			c.Close()
		}
		return err
	}
	// Authorized, the head's Mac learns that no worker runs there yet (the agent does
	// not start workers yet).
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := dial(pki.Node(head), "big-0")
		return err != nil && strings.Contains(err.Error(), "503") && strings.Contains(err.Error(), splitlink.CodeUnavailable),
			fmt.Sprintf("the head's Mac opening the link: %v; want 503 %s", err, splitlink.CodeUnavailable)
	})
	for _, tc := range []struct {
		name string
		id   pki.Identity
		repl string
		want string
	}{
		{"another Mac", pki.Node("mac-intruder"), "big-0", "only the Mac of replica " + ns + "/big-0's head, " + head + ", may open its split link, not mac-intruder"},
		{"the head, to a shard on another Mac", pki.Node(head), "far-0", "no replica of that name holds a worker shard on " + a.node},
		{"a gateway", gatewayID, "big-0", "may not open a split link"},
	} {
		if err := dial(tc.id, tc.repl); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 403 saying %q", tc.name, err, tc.want)
		}
	}
}

// newReplicaObject is a replica of the tiny model bound to node, not created.
func newReplicaObject(ns, name, node string) *v1alpha1.ModelReplica {
	return &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{v1alpha1.LabelDeployment: "big", v1alpha1.LabelTemplateHash: "h1"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template: v1alpha1.ModelReplicaTemplate{
				Model:     v1alpha1.ModelSource{Source: "file://" + tinyModel},
				Engine:    v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 1, KVCacheType: v1alpha1.KVCacheF16}},
				Residency: v1alpha1.ResidencyResident,
			},
			TemplateHash: "h1", MemoryReservation: resource.MustParse("512Mi"), NodeName: node,
		},
	}
}
