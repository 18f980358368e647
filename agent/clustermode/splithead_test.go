package clustermode_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAgentRunsASplitHead: two cluster agents against a real API server, a split
// replica whose head is one Mac and whose worker shard is the other. The worker Mac's
// agent runs its worker and reports it Ready; the head Mac's agent then starts its
// runner across it — through its own split link, over mutual TLS to the worker Mac's
// agent — under its pool reserving the head shard's memory, reports its own
// status.shards entry, and the replica serves a chat.
func TestAgentRunsASplitHead(t *testing.T) {
	head, worker, ns := startSplit(t)
	waitReplica(t, 2*time.Minute, ns, "big-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		phases := map[string]v1alpha1.ReplicaPhase{}
		for _, s := range mr.Status.Shards {
			phases[s.Node] = s.Phase
		}
		ready := meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady)
		return ready && phases[head.node] == v1alpha1.ReplicaRunning && phases[worker.node] == v1alpha1.ReplicaRunning,
			statusJSON(mr)
	})
	m, ok := head.model(ns + "/big-0")
	if !ok || m.ReservedBytes != 256<<20 || len(m.Spec.SplitWorkers) != 1 || m.Spec.SplitWorkers[0].Layers != 1 ||
		!strings.HasPrefix(m.Spec.SplitWorkers[0].Addr, "127.0.0.1:") {
		t.Errorf("the head's pool entry %+v: want the head shard's 256Mi reserved and one worker of 1 layer on loopback", m)
	}
	code, body := head.chat("big", append([]string{v1alpha1.HeaderReplica, ns + "/big-0"}, auth...)...)
	if code != http.StatusOK || !strings.Contains(body, `"completion_tokens":4`) {
		t.Errorf("a chat with the split replica: %d %s", code, body)
	}
}

// startSplit starts the agents of a head's and a worker's Mac and creates replica
// big-0 split across them, in a namespace of its own.
func startSplit(t *testing.T) (head, worker *testAgent, ns string) {
	t.Helper()
	worker = startAgent(t, agentOptions{})
	head = startAgent(t, agentOptions{})
	// The worker Mac's MacNode says where its agent listens (the cluster's macnode
	// registration is not part of this harness).
	mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: worker.node}}
	if err := env.Client.Create(t.Context(), mn); err != nil {
		t.Fatal(err)
	}
	mn.Status.Agent.Address = worker.endpoint
	if err := env.Client.Status().Update(t.Context(), mn); err != nil {
		t.Fatal(err)
	}
	ns = testenv.NewNamespace(t, env.Client)
	createSplit(t, ns, "big-0", head.node, worker.node)
	return head, worker, ns
}
