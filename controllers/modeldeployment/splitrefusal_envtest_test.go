package modeldeployment

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// TestUnsplittableModelIsNeverPlannedAsASplit runs the controller and the scheduler
// against the API server, the memory estimated from a synthesized header served over
// HTTP: a deployment that may span 2 Macs, of a model no Mac holds alone, on two
// Macs that together hold it. A qwen3next model (a hybrid: its delta-net layers keep
// a recurrent state) gets a replica without layerMemory, which stays unplaced, and
// Scheduled False with SplitUnsupported naming the architecture and the fix; the same
// fleet splits a qwen3moe model across both Macs (the test's control).
func TestUnsplittableModelIsNeverPlannedAsASplit(t *testing.T) {
	for _, tc := range []struct {
		family ggufsynth.Family
		split  bool
	}{{ggufsynth.Qwen3Next, false}, {ggufsynth.Qwen3MoE, true}} {
		t.Run(string(tc.family), func(t *testing.T) {
			url := serveFamily(t, tc.family)
			f := newFixture(t)
			f.start(&Reconciler{Resolver: &modelsource.Resolver{}})
			f.startScheduler()
			md := newDeployment("big", url, 1, "")
			md.Spec.Engine.ContextLength = 512
			md.Spec.Placement.MaxMacsPerReplica = 2
			f.create(md)
			mr := f.waitReplicas(1)[0]
			if got := mr.Spec.LayerMemory != nil; got != tc.split {
				t.Fatalf("replica layerMemory %+v, want it set: %v", mr.Spec.LayerMemory, tc.split)
			}
			// Two Macs, each a byte short of the replica's reservation.
			ceiling := mr.Spec.MemoryReservation.Value() - 1
			f.schedulableMac("a", ceiling)
			f.schedulableMac("b", ceiling)

			if tc.split {
				f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
					return len(md.Status.Nodes) == 2, condition(md, v1alpha1.DeploymentScheduled)
				})
				return
			}
			got := f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
				c := condition(md, v1alpha1.DeploymentScheduled)
				// Both Macs seen: together they would hold a split.
				return strings.HasPrefix(c, "False/"+v1alpha1.ReasonSplitUnsupported) && strings.Contains(c, "0/2 Macs fit"), c
			})
			c := condition(got, v1alpha1.DeploymentScheduled)
			t.Logf("Scheduled %s", c)
			for _, want := range []string{"insufficient memory",
				"placement.maxMacsPerReplica 2 is not used: a split of this model across Macs is refused: " +
					"its recurrent layers keep a state beside the attention cache (qwen3next), which split workers do not compute",
				"serve it on one Mac: one with the replica's", "a smaller quant or a shorter engine.contextLength"} {
				if !strings.Contains(c, want) {
					t.Errorf("Scheduled %q lacks %q", c, want)
				}
			}
			for _, r := range f.replicas() {
				if r.Spec.NodeName != "" || r.Spec.Split != nil || r.Spec.LayerMemory != nil {
					t.Errorf("replica %s: nodeName %q, split %+v, layerMemory %+v; want it unplaced, never split",
						r.Name, r.Spec.NodeName, r.Spec.Split, r.Spec.LayerMemory)
				}
			}
		})
	}
}

// serveFamily serves the tiny model of family over HTTP (with range requests, as
// the estimate reads a header) and returns its URL.
func serveFamily(t *testing.T, family ggufsynth.Family) string {
	t.Helper()
	spec, err := ggufsynth.TinyFamily(family)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := ggufsynth.Write(path, spec); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, path)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/model.gguf"
}

// testRunLabel marks the MacNodes of one test, the only ones its scheduler sees.
const testRunLabel = "test.macfleet.dev/run"

// schedulableMac creates a Ready MacNode of the test whose agent reports a ceiling
// of ceiling bytes, and deletes it at the end.
func (f *fixture) schedulableMac(suffix string, ceiling int64) {
	f.t.Helper()
	mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + suffix, Labels: map[string]string{testRunLabel: f.ns}}}
	if err := f.c.Create(f.t.Context(), mn); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), mn) })
	mn.Status.Memory.Ceiling = resource.NewQuantity(ceiling, resource.BinarySI)
	mn.Status.Conditions = []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonAgentReady, LastTransitionTime: metav1.Now()}}
	if err := f.c.Status().Update(f.t.Context(), mn); err != nil {
		f.t.Fatalf("reporting MacNode %s: %v", mn.Name, err)
	}
}

// startScheduler runs the scheduler until the test ends, seeing the test's
// namespace and MacNodes only.
func (f *fixture) startScheduler() {
	f.t.Helper()
	f.startManager(cache.Options{ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.MacNode{}: {Label: labels.SelectorFromSet(labels.Set{testRunLabel: f.ns})},
	}}, (&scheduler.Reconciler{}).SetupWithManager)
}
