package v1alpha1_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestMaxMacsPerReplicaValidation applies placement.maxMacsPerReplica values and the
// combinations that make no sense to the real API server, as JSON so that an explicit
// 0 reaches it.
func TestMaxMacsPerReplicaValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	cases := []struct {
		name      string
		max       int64
		source    string
		residency string
		memory    string
		pipeline  int64 // engine.splitPipeline with parallel 4; 0: unset
		wantErr   string
	}{
		{name: "zero", max: 0, wantErr: "maxMacsPerReplica must be between 1 (every replica on one Mac) and 16"},
		{name: "negative", max: -2, wantErr: "maxMacsPerReplica must be between 1 (every replica on one Mac) and 16"},
		{name: "seventeen", max: 17, wantErr: "maxMacsPerReplica must be between 1 (every replica on one Mac) and 16"},
		{name: "one", max: 1},
		{name: "sixteen", max: 16},
		{name: "four, Pinned", max: 4, residency: "Pinned"},
		{name: "four, OnDemand", max: 4, residency: "OnDemand",
			wantErr: "placement.maxMacsPerReplica above 1 needs residency Resident or Pinned"},
		{name: "one, OnDemand", max: 1, residency: "OnDemand"},
		{name: "two, file source", max: 2, source: "file:///opt/models/big.gguf", memory: "400Gi",
			wantErr: "placement.maxMacsPerReplica above 1 needs an hf://, ollama:// or https:// source"},
		{name: "one, file source", max: 1, source: "file:///opt/models/big.gguf", memory: "400Gi"},
		{name: "one, pipelined", max: 1, pipeline: 2,
			wantErr: "engine.splitPipeline above 1 needs placement.maxMacsPerReplica above 1"},
		{name: "two, pipelined", max: 2, pipeline: 2},
		{name: "one, one context", max: 1, pipeline: 1},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			source := tc.source
			if source == "" {
				source = validDeployment().Model.Source
			}
			spec := map[string]any{
				"model":     map[string]any{"source": source},
				"placement": map[string]any{"maxMacsPerReplica": tc.max},
			}
			if tc.residency != "" {
				spec["residency"] = tc.residency
			}
			if tc.memory != "" {
				spec["resources"] = map[string]any{"memory": tc.memory}
			}
			if tc.pipeline != 0 {
				spec["engine"] = map[string]any{"parallel": 4, "splitPipeline": tc.pipeline}
			}
			err := createUnstructured(t, map[string]any{
				"apiVersion": mfv1.GroupVersion.String(), "kind": "ModelDeployment",
				"metadata": map[string]any{"namespace": ns, "name": "gang-" + strconv.Itoa(i)},
				"spec":     spec,
			})
			checkErr(t, err, tc.wantErr)
		})
	}
}

// TestModelReplicaSplitValidation binds a replica as a gang and checks that the split
// is set with nodeName, names the head first and never changes.
func TestModelReplicaSplitValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	ctx := t.Context()
	split := func(head string) *mfv1.ReplicaSplit {
		return &mfv1.ReplicaSplit{Shards: []mfv1.ReplicaShard{
			{Node: head, FirstLayer: 0, LastLayer: 39, Memory: resource.MustParse("60Gi")},
			{Node: "mac-b", FirstLayer: 40, LastLayer: 79, Memory: resource.MustParse("58Gi")},
		}, Macs: head + ",mac-b", Layers: "0-39,40-79"}
	}
	newReplica := func(name string) *mfv1.ModelReplica {
		return &mfv1.ModelReplica{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: mfv1.ModelReplicaSpec{
				Template:          mfv1.ModelReplicaTemplate{Model: validDeployment().Model},
				TemplateHash:      "abc",
				MemoryReservation: resource.MustParse("117Gi"),
				LayerMemory: &mfv1.LayerMemory{Layers: 80, PerLayer: resource.MustParse("1470Mi"),
					Head: resource.MustParse("2Gi"), Worker: resource.MustParse("300Mi")},
			},
		}
	}
	mr := newReplica("gang")
	if err := env.Client.Create(ctx, mr); err != nil {
		t.Fatalf("creating: %v", err)
	}
	applyReplicaSteps(t, client.ObjectKeyFromObject(mr), []replicaStep{
		{name: "split without nodeName", mutate: func(r *mfv1.ModelReplica) { r.Spec.Split = split("mac-a") },
			wantErr: "split.shards[0] is the head: its node must be nodeName"},
		{name: "head not nodeName", mutate: func(r *mfv1.ModelReplica) { r.Spec.NodeName, r.Spec.Split = "mac-c", split("mac-a") },
			wantErr: "split.shards[0] is the head: its node must be nodeName"},
		{name: "one Mac twice", mutate: func(r *mfv1.ModelReplica) {
			r.Spec.NodeName, r.Spec.Split = "mac-b", split("mac-b")
		}, wantErr: `spec.split.shards[1]: Duplicate value`},
		{name: "a range backwards", mutate: func(r *mfv1.ModelReplica) {
			r.Spec.NodeName, r.Spec.Split = "mac-a", split("mac-a")
			r.Spec.Split.Shards[1].FirstLayer = 80
		}, wantErr: "each shard's firstLayer must not be after its lastLayer"},
		{name: "a single shard", mutate: func(r *mfv1.ModelReplica) {
			r.Spec.NodeName, r.Spec.Split = "mac-a", split("mac-a")
			r.Spec.Split.Shards = r.Spec.Split.Shards[:1]
		}, wantErr: "spec.split.shards: Invalid value"},
		{name: "bind as a gang", mutate: func(r *mfv1.ModelReplica) { r.Spec.NodeName, r.Spec.Split = "mac-a", split("mac-a") }},
		{name: "move a shard", mutate: func(r *mfv1.ModelReplica) { r.Spec.Split.Shards[1].Node = "mac-c" },
			wantErr: "split is immutable once set: delete the replica to place it again"},
		{name: "drop the split", mutate: func(r *mfv1.ModelReplica) { r.Spec.Split = nil },
			wantErr: "split is immutable once set"},
		{name: "change the layer memory", mutate: func(r *mfv1.ModelReplica) { r.Spec.LayerMemory.Layers = 81 },
			wantErr: "layerMemory is immutable"},
	})

	// kubectl: the default columns are unchanged; -o wide shows the Macs and layers.
	_, kubectl := kubectlFor(t)
	out := kubectl("get", "-n", ns, "mr", "gang")
	if head := strings.Fields(strings.SplitN(out, "\n", 2)[0]); slices.Contains(head, "MACS") {
		t.Errorf("kubectl get mr shows MACS without -o wide:\n%s", out)
	}
	wide := strings.Split(strings.TrimSpace(kubectl("get", "-n", ns, "mr", "gang", "-o", "wide")), "\n")
	head, row := strings.Fields(wide[0]), strings.Fields(wide[1])
	for col, want := range map[string]string{"NODE": "mac-a", "MACS": "mac-a,mac-b", "LAYERS": "0-39,40-79"} {
		if i := slices.Index(head, col); i < 0 || i >= len(row) || row[i] != want {
			t.Errorf("kubectl get mr -o wide: column %s is not %q:\n%s", col, want, strings.Join(wide, "\n"))
		}
	}
}

// replicaStep is one update of a replica and the message it is rejected with ("":
// accepted).
type replicaStep struct {
	name    string
	mutate  func(*mfv1.ModelReplica)
	wantErr string
}

// applyReplicaSteps applies each step, in order, to the replica as the API server has
// it, as a subtest.
func applyReplicaSteps(t *testing.T, key client.ObjectKey, steps []replicaStep) {
	t.Helper()
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			cur := &mfv1.ModelReplica{}
			if err := env.Client.Get(t.Context(), key, cur); err != nil {
				t.Fatal(err)
			}
			s.mutate(cur)
			checkErr(t, env.Client.Update(t.Context(), cur), s.wantErr)
		})
	}
}

// TestMacNodeLinkValidation sets the operator's link speed.
func TestMacNodeLinkValidation(t *testing.T) {
	for i, tc := range []struct {
		name, bandwidth, wantErr string
	}{
		{name: "10 GbE", bandwidth: "10G"},
		{name: "Thunderbolt 5", bandwidth: "80G"},
		{name: "zero", bandwidth: "0", wantErr: "link.bandwidth must be positive, in bits per second (e.g. 10G)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mn := &mfv1.MacNode{
				ObjectMeta: metav1.ObjectMeta{Name: "link-mac-" + strconv.Itoa(i)},
				Spec:       mfv1.MacNodeSpec{Link: &mfv1.Link{Bandwidth: ptr.To(resource.MustParse(tc.bandwidth))}},
			}
			err := env.Client.Create(t.Context(), mn)
			if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(t.Context(), mn) })
			}
			checkErr(t, err, tc.wantErr)
		})
	}
}
