package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/testenv"
)

// TestAttackCraftedGGUFHeader: a tenant deploys a source whose GGUF header of a few
// hundred bytes declares a 256 MiB string in a file of 8 GiB (sparse), or 2^25
// layers; the manager, which reads every deployment's header, must say in the
// deployment's condition which limit the header went over, and go on estimating
// other deployments. Before the limits the first cost the manager half a GiB per
// read (and ended in an unrelated error), and the second panicked the estimator in
// every reconcile of the deployment, which never got a condition.
func TestAttackCraftedGGUFHeader(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	crafted := map[string]struct {
		header []byte
		size   int64
		limit  string
	}{
		"string": {new(ggufsynth.Raw).String("general.architecture", "llama").
			StringLen("general.name", 256<<20, nil).Bytes(), 8 << 30, "string length"},
		"layers": {new(ggufsynth.Raw).String("general.architecture", "llama").
			Uint64("llama.block_count", 1<<25).Uint32("llama.feed_forward_length", 64).
			Uint32("llama.embedding_length", 64).Uint32("llama.attention.head_count", 1).
			Tensor("token_embd.weight", 0, 64, 16).Bytes(), 0, "block count"},
	}
	for name, c := range crafted {
		file := fmt.Sprintf("crafted-%s-%s.gguf", ns, name)
		p := filepath.Join(fleet.ModelsDir, file)
		if err := os.WriteFile(p, c.header, 0o644); err != nil {
			t.Fatal(err)
		}
		if c.size > 0 {
			if err := os.Truncate(p, c.size); err != nil { // sparse: no disk, the server says 8 GiB
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { _ = os.Remove(p) })
		create(t, deployment(ns, "crafted-"+name, 1, func(md *v1alpha1.ModelDeployment) {
			md.Spec.Model.Source = fleet.ModelsURL + "/" + file
		}))
	}
	for name, c := range crafted {
		testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
			var md v1alpha1.ModelDeployment
			if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "crafted-" + name}, &md); err != nil {
				return false, err.Error()
			}
			for _, cond := range md.Status.Conditions {
				if cond.Type == v1alpha1.DeploymentProgressing && cond.Reason == v1alpha1.ReasonEstimateFailed &&
					strings.Contains(cond.Message, "declares a "+c.limit) && strings.Contains(cond.Message, "over the limit of") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("crafted-%s: conditions %+v, want %s/%s naming the %s limit", name, md.Status.Conditions,
				v1alpha1.DeploymentProgressing, v1alpha1.ReasonEstimateFailed, c.limit)
		})
	}
	// The manager is still there: an honest deployment gets its estimate.
	create(t, deployment(ns, "honest", 0))
	testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "honest"}, &md); err != nil {
			return false, err.Error()
		}
		return md.Status.EstimatedMemory != nil, fmt.Sprintf("honest: status %+v", md.Status)
	})
}
