package credentials_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// splitReplica is a replica split across head and worker (its spec as the scheduler
// binds it).
func splitReplica(ns, name, head, worker string) *v1alpha1.ModelReplica {
	r := replica(ns, name, head)
	r.Labels[v1alpha1.ShardLabel(worker)] = v1alpha1.ShardLabelWorker
	r.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: head, FirstLayer: 0, LastLayer: 3, Memory: resource.MustParse("1Gi")},
		{Node: worker, FirstLayer: 4, LastLayer: 7, Memory: resource.MustParse("1Gi")},
	}}
	return r
}

// setShard writes node's entry of status.shards.
func setShard(node string, phase v1alpha1.ReplicaPhase, resident string) func(*v1alpha1.ModelReplica) {
	return func(r *v1alpha1.ModelReplica) {
		e := v1alpha1.ShardStatus{Node: node, Phase: phase, Resident: new(resource.MustParse(resident))}
		for i := range r.Status.Shards {
			if r.Status.Shards[i].Node == node {
				r.Status.Shards[i] = e
				return
			}
		}
		r.Status.Shards = append(r.Status.Shards, e)
	}
}

// TestAttackWorkerShardWritesAnotherEntry: the agent of a Mac holding a worker shard of a split replica
// writes its own entry of status.shards and nothing else of the replica; no node, the
// head's included, writes another node's entry, and a Mac with no shard writes none.
func TestAttackWorkerShardWritesAnotherEntry(t *testing.T) {
	install(t)
	admin := env.Client
	ctx := t.Context()
	forget(t, "mac-sh", "mac-sw", "mac-sx")
	head, _ := issue(t, "mac-sh")
	worker, _ := issue(t, "mac-sw")
	other, _ := issue(t, "mac-sx")
	waitForPolicy(t, head)
	ns := testenv.NewNamespace(t, admin)
	for _, n := range []string{"mac-sh", "mac-sw", "mac-sx"} {
		if err := admin.Create(ctx, macNode(n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*v1alpha1.ModelReplica{splitReplica(ns, "split", "mac-sh", "mac-sw"), replica(ns, "plain", "mac-sh")} {
		if err := admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	const policy = "denied request: "
	steps := []struct {
		name    string
		do      func() error
		wantErr []string
	}{
		{"the worker writes its own entry", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", setShard("mac-sw", v1alpha1.ReplicaLoading, "1Gi"))
		}, nil},
		{"the head writes its own entry and the phase", func() error {
			return patchReplicaStatus(ctx, head, ns, "split", func(r *v1alpha1.ModelReplica) {
				setShard("mac-sh", v1alpha1.ReplicaLoading, "2Gi")(r)
				r.Status.Phase = v1alpha1.ReplicaLoading
			})
		}, nil},
		{"the worker updates its own entry", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", setShard("mac-sw", v1alpha1.ReplicaRunning, "3Gi"))
		}, nil},
		{"the worker sets the replica's phase", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", func(r *v1alpha1.ModelReplica) { r.Status.Phase = v1alpha1.ReplicaRunning })
		}, []string{policy, "node mac-sw holds a worker shard of modelreplicas/status " + ns + "/split: it may only write its own entry of status.shards, not phase"}},
		{"the worker advertises an endpoint", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", func(r *v1alpha1.ModelReplica) { r.Status.Endpoint = addrB })
		}, []string{policy, "not endpoint"}},
		{"the worker writes the head's entry", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", setShard("mac-sh", v1alpha1.ReplicaFailed, "1Gi"))
		}, []string{policy, "node mac-sw may only write its own entry of status.shards, not those of mac-sh in modelreplicas/status " + ns + "/split"}},
		{"the worker removes the head's entry", func() error {
			return patchReplicaStatus(ctx, worker, ns, "split", func(r *v1alpha1.ModelReplica) {
				r.Status.Shards = slices.DeleteFunc(r.Status.Shards, func(s v1alpha1.ShardStatus) bool { return s.Node == "mac-sh" })
			})
		}, []string{policy, "not those of mac-sh"}},
		{"the head writes the worker's entry", func() error {
			return patchReplicaStatus(ctx, head, ns, "split", setShard("mac-sw", v1alpha1.ReplicaFailed, "1Gi"))
		}, []string{policy, "node mac-sh may only write its own entry of status.shards, not those of mac-sw"}},
		{"another Mac writes an entry of its own", func() error {
			return patchReplicaStatus(ctx, other, ns, "split", setShard("mac-sx", v1alpha1.ReplicaRunning, "1Gi"))
		}, []string{policy, "node mac-sx may only update the status of ModelReplicas bound to it; modelreplicas/status " + ns + "/split is bound to mac-sh"}},
		{"another Mac writes the worker's entry", func() error {
			return patchReplicaStatus(ctx, other, ns, "split", setShard("mac-sw", v1alpha1.ReplicaFailed, "1Gi"))
		}, []string{policy, "bound to mac-sh"}},
		{"the worker writes another replica of the head's", func() error {
			return patchReplicaStatus(ctx, worker, ns, "plain", setShard("mac-sw", v1alpha1.ReplicaRunning, "1Gi"))
		}, []string{policy, "node mac-sw may only update the status of ModelReplicas bound to it; modelreplicas/status " + ns + "/plain is bound to mac-sh"}},
	}
	for _, s := range steps {
		err := s.do()
		switch {
		case len(s.wantErr) == 0 && err != nil:
			t.Errorf("%s: %v", s.name, err)
		case len(s.wantErr) > 0 && err == nil:
			t.Errorf("%s: allowed, want denied with %q", s.name, s.wantErr)
		case len(s.wantErr) > 0:
			for _, w := range s.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v, want %q in it", s.name, err, w)
				}
			}
		}
	}
	var got v1alpha1.ModelReplica
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "split"}, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"mac-sh": string(v1alpha1.ReplicaLoading) + " 2Gi", "mac-sw": string(v1alpha1.ReplicaRunning) + " 3Gi"}
	have := map[string]string{}
	for _, s := range got.Status.Shards {
		have[s.Node] = string(s.Phase) + " " + s.Resident.String()
	}
	if !reflect.DeepEqual(have, want) || got.Status.Phase != v1alpha1.ReplicaLoading || got.Status.Endpoint != "" {
		t.Errorf("status: shards %v, phase %s, endpoint %q; want shards %v, phase Loading, no endpoint (the refused writes left nothing)",
			have, got.Status.Phase, got.Status.Endpoint, want)
	}
}

// TestNodeRestrictionListsReplicaStatusFields: the policy compares, for a worker shard's
// update, every field of a replica's status but shards; a field added to
// ModelReplicaStatus must be added there too, or a worker could write it.
func TestNodeRestrictionListsReplicaStatusFields(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "admission", "node-restriction.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var policy struct {
		Spec struct {
			Variables []struct{ Name, Expression string }
		}
	}
	if err := yaml.Unmarshal(raw, &policy); err != nil {
		t.Fatal(err)
	}
	expr := ""
	for _, v := range policy.Spec.Variables {
		if v.Name == "workerChanges" {
			expr = v.Expression
		}
	}
	if expr == "" {
		t.Fatal("node-restriction.yaml has no variable workerChanges")
	}
	st := reflect.TypeFor[v1alpha1.ModelReplicaStatus]()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name == "shards" {
			continue
		}
		if !strings.Contains(expr, "variables.newStatus."+name+" == variables.oldStatus."+name) || !strings.Contains(expr, "['"+name+"']") {
			t.Errorf("workerChanges does not compare status.%s: a worker shard's agent could write it", name)
		}
	}
}
