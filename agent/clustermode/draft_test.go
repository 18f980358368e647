package clustermode

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
)

// TestReplicaDraftFile: a replica's draft model (spec.model.draft) is one of its
// files: kept by the pruner, fetched beside the model, and a changed draft is other
// files (the replica starts over). Its fetch: TestFetchBeside.
func TestReplicaDraftFile(t *testing.T) {
	model := v1alpha1.ModelSource{Source: "hf://o/r/m.gguf", SHA256: "aa"}
	drafted := model
	drafted.Draft, drafted.DraftSHA256 = "hf://o/r/small.gguf", "cc"
	if d := cmp.Diff([]store.Model{{Source: "hf://o/r/m.gguf", SHA256: "aa"}, {Source: "hf://o/r/small.gguf", SHA256: "cc"}}, filesOf(drafted)); d != "" {
		t.Errorf("filesOf (-want +got):\n%s", d)
	}
	other := drafted
	other.DraftSHA256 = "dd"
	for _, tc := range []struct {
		a, b v1alpha1.ModelSource
		same bool
	}{{drafted, drafted, true}, {model, drafted, false}, {drafted, other, false}} {
		if got := sameFiles(tc.a, tc.b); got != tc.same {
			t.Errorf("sameFiles(%+v, %+v) = %v", tc.a, tc.b, got)
		}
	}
}
