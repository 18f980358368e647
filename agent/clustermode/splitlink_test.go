package clustermode_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/syncbuf"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// listenAddr finds the address in a runner's listening line.
var listenAddr = regexp.MustCompile(`"event":"listening"[^}]*"addr":"([^"]+)"`)

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

// TestAgentRunsItsWorkerShards: the cluster agent of a Mac holding a worker shard of a
// split replica finds the replica by its worker label (the head's Mac is another),
// runs `macfleet-runner worker` for it under its engine pool (the shard's memory
// reserved in the committed account, its footprint measured), reports its own entry of
// status.shards, and lets only the head's Mac open the split link to it, over mutual
// TLS: a real runner on the head's side, split across the worker through the link,
// loads. A replica whose worker shard is on another Mac is unknown to it; a replica
// deleted removes its worker from the pool.
func TestAgentRunsItsWorkerShards(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	head := fmt.Sprintf("mac-head-%d", nodeSeq.Add(1))
	createSplit(t, ns, "big-0", head, a.node)
	createSplit(t, ns, "far-0", head, "mac-elsewhere")
	entry := "split-worker:" + ns + "/big-0"
	waitReplica(t, time.Minute, ns, "big-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		for _, s := range mr.Status.Shards {
			if s.Node == a.node {
				return s.Phase == v1alpha1.ReplicaRunning && s.Resident != nil && s.Resident.Value() > 0, statusJSON(mr)
			}
		}
		return false, "no entry of " + a.node + " in status.shards: " + statusJSON(mr)
	})
	st := a.status()
	var m enginepool.ModelSnapshot
	for _, x := range st.Models {
		if x.Name == entry {
			m = x
		}
	}
	if m.ReservedBytes != 256<<20 || st.CommittedBytes < 256<<20 || m.ResidentBytes <= 0 {
		t.Errorf("pool entry %s: reserved %d, resident %d, pool committed %d; want the shard's 256Mi reserved and counted, and measured",
			entry, m.ReservedBytes, m.ResidentBytes, st.CommittedBytes)
	}

	dial := func(id pki.Identity, name string) (net.Conn, error) {
		return splitlink.Dial(t.Context(), a.endpoint, source(t, &id).ClientConfig(pki.Node(a.node)), ns, name)
	}
	// The head's side: a forwarder for a real runner holding layer 0, the worker layer 1.
	fwd, err := splitlink.Forward(func(context.Context) (net.Conn, error) { return dial(pki.Node(head), "big-0") }, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runner := exec.CommandContext(ctx, runnerPath(t), "--model", tinyModel, "--addr", "127.0.0.1:0", "--threads", "1", "--ctx", "512",
		"--split-worker", fwd.Addr(), "--split-layers", "1")
	var out syncbuf.Buffer
	runner.Stdout, runner.Stderr = &out, &out
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = runner.Wait(); close(exited) }()
	t.Cleanup(func() { _ = runner.Process.Kill(); <-exited })
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("the head's runner exited: %v\n%s", waitErr, out.String())
		default:
		}
		m := listenAddr.FindStringSubmatch(out.String())
		if m == nil {
			return false, "waiting for the split runner to listen"
		}
		resp, err := http.Get("http://" + m[1] + "/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b), `"failed"`) {
			t.Fatalf("the split runner failed: %s\n%s", b, out.String())
		}
		return strings.Contains(string(b), `"ready"`), "the split runner's /health: " + string(b)
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
		c, err := dial(tc.id, tc.repl)
		if err == nil {
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 403 saying %q", tc.name, err, tc.want)
		}
	}

	if err := env.Client.Delete(t.Context(), newReplicaObject(ns, "big-0", head)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, found := a.model(entry)
		return !found, "the deleted replica's worker is still in the pool"
	})
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
