package console

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

func TestPromptCacheRow(t *testing.T) {
	tests := []struct {
		name string
		in   PromptCache
		want PromptCacheRow
	}{
		{name: "no lookups", in: PromptCache{Replicas: 1},
			want: PromptCacheRow{Hot: "—", SSD: "—", Miss: "—", Restored: "0 tokens restored", FromPeers: "not yet (no peer fetch)"}},
		// 10 lookups: 5 hot hits; of the 5 hot misses 2 were SSD hits, 3 missed both.
		{name: "by tier", in: PromptCache{HotHits: 5, HotMisses: 5, SSDHits: 2, RestoredTokens: 4096, Replicas: 2},
			want: PromptCacheRow{Lookups: 10, Hot: "50%", SSD: "20%", Miss: "30%", Restored: "4096 tokens restored",
				FromPeers: "not yet (no peer fetch)"}},
		{name: "a replica did not report", in: PromptCache{HotHits: 1, HotMisses: 2, Replicas: 1, Unreported: 2},
			want: PromptCacheRow{Lookups: 3, Hot: "33%", SSD: "0%", Miss: "67%", Restored: "0 tokens restored",
				FromPeers: "not yet (no peer fetch)", Note: "2 of 3 ready replicas did not report"}},
		// Counters read at different moments may show more SSD hits than hot misses.
		{name: "miss never negative", in: PromptCache{HotHits: 1, HotMisses: 1, SSDHits: 2, Replicas: 1},
			want: PromptCacheRow{Lookups: 2, Hot: "50%", SSD: "100%", Miss: "0%", Restored: "0 tokens restored",
				FromPeers: "not yet (no peer fetch)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, promptCacheRow(tc.in)); d != "" {
				t.Errorf("row (-want +got):\n%s", d)
			}
		})
	}
}

func TestBuildModelsShowsThePromptCache(t *testing.T) {
	dep := func(name string) mfv1.ModelDeployment {
		return mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	s := Snapshot{Deployments: []mfv1.ModelDeployment{dep("cached"), dep("silent")},
		PromptCache: map[string]PromptCache{"ns/cached": {HotHits: 3, HotMisses: 1, SSDHits: 1, Replicas: 1}}}
	p := BuildModels(s)
	if len(p.Deployments) != 2 {
		t.Fatalf("%d deployments, want 2", len(p.Deployments))
	}
	want := &PromptCacheRow{Lookups: 4, Hot: "75%", SSD: "25%", Miss: "0%", Restored: "0 tokens restored", FromPeers: "not yet (no peer fetch)"}
	if d := cmp.Diff(want, p.Deployments[0].PromptCache); d != "" {
		t.Errorf("ns/cached prompt cache (-want +got):\n%s", d)
	}
	if p.Deployments[1].PromptCache != nil {
		t.Errorf("ns/silent shows a prompt cache nobody reported: %+v", p.Deployments[1].PromptCache)
	}
}
