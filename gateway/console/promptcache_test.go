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
			want: PromptCacheRow{Hot: "—", SSD: "—", Miss: "—", Restored: "0 tokens restored", FromPeers: "none fetched"}},
		// 10 lookups: 5 hot hits; of the 5 hot misses 2 were SSD hits, 3 missed both.
		{name: "by tier", in: PromptCache{HotHits: 5, HotMisses: 5, SSDHits: 2, RestoredTokens: 4096, Replicas: 2},
			want: PromptCacheRow{Lookups: 10, Hot: "50%", SSD: "20%", Miss: "30%", Restored: "4096 tokens restored",
				FromPeers: "none fetched"}},
		{name: "a replica did not report", in: PromptCache{HotHits: 1, HotMisses: 2, Replicas: 1, Unreported: 2},
			want: PromptCacheRow{Lookups: 3, Hot: "33%", SSD: "0%", Miss: "67%", Restored: "0 tokens restored",
				FromPeers: "none fetched", Note: "2 of 3 ready replicas did not report"}},
		{name: "fetched from peers", in: PromptCache{HotHits: 2, HotMisses: 2, Replicas: 2, PeerBytes: 13107200,
			PeerFetches: map[string]int64{"imported": 3, "not_found": 1, "incompatible": 2}},
			want: PromptCacheRow{Lookups: 4, Hot: "50%", SSD: "0%", Miss: "50%", Restored: "0 tokens restored",
				FromPeers: "12.5 MiB (3 imported; 2 incompatible, 1 not_found)"}},
		{name: "only misses", in: PromptCache{Replicas: 1, PeerFetches: map[string]int64{"unavailable": 1}},
			want: PromptCacheRow{Hot: "—", SSD: "—", Miss: "—", Restored: "0 tokens restored", FromPeers: "0 B (0 imported; 1 unavailable)"}},
		// Counters read at different moments may show more SSD hits than hot misses.
		{name: "miss never negative", in: PromptCache{HotHits: 1, HotMisses: 1, SSDHits: 2, Replicas: 1},
			want: PromptCacheRow{Lookups: 2, Hot: "50%", SSD: "100%", Miss: "0%", Restored: "0 tokens restored",
				FromPeers: "none fetched"}},
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
	want := &PromptCacheRow{Lookups: 4, Hot: "75%", SSD: "25%", Miss: "0%", Restored: "0 tokens restored", FromPeers: "none fetched"}
	if d := cmp.Diff(want, p.Deployments[0].PromptCache); d != "" {
		t.Errorf("ns/cached prompt cache (-want +got):\n%s", d)
	}
	if p.Deployments[1].PromptCache != nil {
		t.Errorf("ns/silent shows a prompt cache nobody reported: %+v", p.Deployments[1].PromptCache)
	}
}

func TestPromptCacheAddsPeerFetches(t *testing.T) {
	a := PromptCache{PeerBytes: 100, PeerFetches: map[string]int64{"imported": 1}, Replicas: 1}
	b := PromptCache{PeerBytes: 50, PeerFetches: map[string]int64{"imported": 2, "corrupt": 1}, Replicas: 1}
	want := PromptCache{PeerBytes: 150, PeerFetches: map[string]int64{"imported": 3, "corrupt": 1}, Replicas: 2}
	if d := cmp.Diff(want, a.Add(b)); d != "" {
		t.Errorf("Add (-want +got):\n%s", d)
	}
	if a.PeerFetches["imported"] != 1 {
		t.Errorf("Add changed its receiver's counts: %v", a.PeerFetches)
	}
	if d := cmp.Diff(PromptCache{Replicas: 1}, (PromptCache{}).Add(PromptCache{Replicas: 1})); d != "" {
		t.Errorf("Add without fetches (-want +got):\n%s", d)
	}
}
