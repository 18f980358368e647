package clustermode

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
)

// fetchRecorder is a Store that records what it was asked for.
type fetchRecorder struct {
	got []string
	err error
}

func (f *fetchRecorder) Fetch(_ context.Context, namespace, source, sha256 string, _ func(int64, int64)) (string, error) {
	f.got = append(f.got, namespace+" "+source+" "+sha256)
	return "/store/" + source[strings.LastIndex(source, "/")+1:], f.err
}

func TestReplicaFiles(t *testing.T) {
	model := v1alpha1.ModelSource{Source: "hf://o/r/m.gguf", SHA256: "aa"}
	vision := model
	vision.Projector, vision.ProjectorSHA256 = "hf://o/r/mmproj.gguf", "bb"
	if d := cmp.Diff([]store.Model{{Source: "hf://o/r/m.gguf", SHA256: "aa"}, {Source: "hf://o/r/mmproj.gguf", SHA256: "bb"}}, filesOf(vision)); d != "" {
		t.Errorf("filesOf (-want +got):\n%s", d)
	}
	if len(filesOf(model)) != 1 {
		t.Errorf("filesOf without a projector: %v", filesOf(model))
	}
	other := vision
	other.Projector = "hf://o/r/mmproj-q8.gguf"
	for _, tc := range []struct {
		a, b v1alpha1.ModelSource
		same bool
	}{{model, model, true}, {vision, vision, true}, {model, vision, false}, {vision, other, false}} {
		if got := sameFiles(tc.a, tc.b); got != tc.same {
			t.Errorf("sameFiles(%+v, %+v) = %v", tc.a, tc.b, got)
		}
	}

}

// TestFetchBeside: the files beside a model (its projector, its draft model) are
// fetched from their own sources and digests, none when the deployment names none,
// and a failed fetch names the file.
func TestFetchBeside(t *testing.T) {
	model := v1alpha1.ModelSource{Source: "hf://o/r/m.gguf", SHA256: "aa"}
	full := model
	full.Projector, full.ProjectorSHA256 = "hf://o/r/mmproj.gguf", "bb"
	full.Draft, full.DraftSHA256 = "hf://o/r/small.gguf", "cc"
	for _, tc := range []struct {
		what, path, asked string
		fetch             func(context.Context, Store, string, v1alpha1.ModelSource) (string, error)
	}{
		{"projector", "/store/mmproj.gguf", "team hf://o/r/mmproj.gguf bb", fetchProjector},
		{"draft model", "/store/small.gguf", "team hf://o/r/small.gguf cc", fetchDraft},
	} {
		st := &fetchRecorder{}
		if p, err := tc.fetch(context.Background(), st, "team", model); p != "" || err != nil || len(st.got) != 0 {
			t.Errorf("a model without a %s fetched %v: %q, %v", tc.what, st.got, p, err)
		}
		p, err := tc.fetch(context.Background(), st, "team", full)
		if p != tc.path || err != nil || cmp.Diff([]string{tc.asked}, st.got) != "" {
			t.Errorf("fetching the %s: %q, %v, asked %v", tc.what, p, err, st.got)
		}
		st.err = errors.New("404")
		if _, err := tc.fetch(context.Background(), st, "team", full); err == nil || !strings.Contains(err.Error(), "fetching the "+tc.what+" hf://o/r/") {
			t.Errorf("a failed fetch of the %s: %v", tc.what, err)
		}
	}
}
