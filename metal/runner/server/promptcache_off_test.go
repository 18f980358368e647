//go:build cgo && !race

package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func TestPromptCacheOff(t *testing.T) {
	for _, tc := range []struct {
		arch              string
		recurrent, hybrid bool
		want              []runnerapi.PathOff
	}{
		{arch: "llama"},
		{arch: "gemma3"},
		{arch: "qwen3next", hybrid: true, want: []runnerapi.PathOff{{Path: runnerapi.PathPromptCache,
			Reason: "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (qwen3next)"}}},
		{arch: "mamba", recurrent: true, want: []runnerapi.PathOff{{Path: runnerapi.PathPromptCache,
			Reason: "off: the model keeps a recurrent state, which cannot be cut back to a prefix (mamba)"}}},
	} {
		cs := &cacheStore{off: promptCacheOff(tc.arch, tc.recurrent, tc.hybrid)}
		if diff := cmp.Diff(tc.want, cs.offPaths()); diff != "" {
			t.Errorf("%s: off paths (-want +got):\n%s", tc.arch, diff)
		}
	}
}
