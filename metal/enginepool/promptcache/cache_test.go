package promptcache

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLongestAcrossTiers: the longest cached prefix wins whichever tier holds it; at
// equal depth the hot tier serves; SSD hits are promoted unless NoPromote.
func TestLongestAcrossTiers(t *testing.T) {
	conv := seq(4*256+100, 3) // four full blocks and a partial one
	keys := BlockKeys(testID, "", conv, 256)
	state := func(depth int) []byte { return payload(depth, 500+depth) }

	tests := []struct {
		name      string
		hot, ssd  []int // depths stored in each tier
		noPromote bool
		wantDepth int
		wantTier  Tier
		// wantHot are the hot/SSD hit and miss counts after the lookup.
		wantHot [2]int64
		wantSSD [2]int64
	}{
		{name: "nothing cached", wantTier: TierNone, wantHot: [2]int64{0, 1}, wantSSD: [2]int64{0, 1}},
		{name: "hot only", hot: []int{1, 2}, wantDepth: 2, wantTier: TierHot, wantHot: [2]int64{1, 0}},
		{name: "ssd only", ssd: []int{3}, wantDepth: 3, wantTier: TierSSD, wantHot: [2]int64{0, 1}, wantSSD: [2]int64{1, 0}},
		{name: "ssd deeper than hot", hot: []int{1}, ssd: []int{1, 4}, wantDepth: 4, wantTier: TierSSD, wantHot: [2]int64{0, 1}, wantSSD: [2]int64{1, 0}},
		{name: "hot deeper than ssd", hot: []int{3}, ssd: []int{2}, wantDepth: 3, wantTier: TierHot, wantHot: [2]int64{1, 0}},
		{name: "equal depth prefers hot", hot: []int{2}, ssd: []int{2}, wantDepth: 2, wantTier: TierHot, wantHot: [2]int64{1, 0}},
		{name: "no promotion", ssd: []int{2}, noPromote: true, wantDepth: 2, wantTier: TierSSD, wantHot: [2]int64{0, 1}, wantSSD: [2]int64{1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(NewHot(1<<20), openSSD(t, SSDConfig{}))
			c.NoPromote = tt.noPromote
			for _, d := range tt.ssd {
				c.SSD.Save(keys[d-1], state(d))
			}
			waitSettled(t, c.SSD)
			for _, d := range tt.hot {
				c.Hot.Put(keys[d-1], state(d))
			}
			depth, data, tier := c.Longest(keys)
			if depth != tt.wantDepth || tier != tt.wantTier {
				t.Fatalf("Longest = depth %d from %q, want %d from %q", depth, tier, tt.wantDepth, tt.wantTier)
			}
			if depth > 0 && !bytes.Equal(data, state(depth)) {
				t.Errorf("wrong state for depth %d", depth)
			}
			hs, ss := c.Hot.Stats(), c.SSD.Stats()
			got := [2][2]int64{{hs.Hits, hs.Misses}, {ss.Hits, ss.Misses}}
			if diff := cmp.Diff([2][2]int64{tt.wantHot, tt.wantSSD}, got); diff != "" {
				t.Errorf("hot and ssd hits/misses (-want +got):\n%s", diff)
			}
			// A second lookup of an SSD hit comes from hot, unless promotion is off.
			if tier == TierSSD {
				_, _, again := c.Longest(keys)
				want := TierHot
				if tt.noPromote {
					want = TierSSD
				}
				if again != want {
					t.Errorf("second lookup from %q, want %q", again, want)
				}
			}
		})
	}
}

// TestCacheTurns walks a conversation: each turn saves its state at its deepest full
// block; the next, longer prompt finds it; after a hot clear the SSD serves it; a
// prompt that diverges early finds only the shared prefix; Forget removes both tiers.
func TestCacheTurns(t *testing.T) {
	c := New(NewHot(1<<20), openSSD(t, SSDConfig{}))
	const bs = 16
	turn1 := seq(40, 1)                                         // 2 blocks
	turn2 := append(append([]int32{}, turn1...), seq(30, 2)...) // 4 blocks
	k1, k2 := BlockKeys(testID, "", turn1, bs), BlockKeys(testID, "", turn2, bs)

	if d, _, _ := c.Longest(k1); d != 0 {
		t.Fatalf("empty cache matched depth %d", d)
	}
	if err := c.Save(k1[len(k1)-1], []byte("state after turn 1")); err != nil {
		t.Fatal(err)
	}
	if d, data, tier := c.Longest(k2); d != 2 || tier != TierHot || string(data) != "state after turn 1" {
		t.Fatalf("turn 2 lookup = %d %q %q", d, tier, data)
	}
	c.Save(k2[len(k2)-1], []byte("state after turn 2"))
	waitSettled(t, c.SSD)

	if b, n := c.Hot.Clear(); n != 2 || b != int64(2*len("state after turn 1")) {
		t.Errorf("hot Clear = %d bytes, %d entries", b, n)
	}
	turn3 := append(append([]int32{}, turn2...), seq(20, 3)...)
	if d, data, tier := c.Longest(BlockKeys(testID, "", turn3, bs)); d != 4 || tier != TierSSD || string(data) != "state after turn 2" {
		t.Fatalf("turn 3 after a hot clear = %d %q %q", d, tier, data)
	}
	// A prompt sharing only the first block.
	other := append(append([]int32{}, turn1[:bs]...), seq(40, 9)...)
	if d, _, _ := c.Longest(BlockKeys(testID, "", other, bs)); d != 0 {
		t.Errorf("diverging prompt matched depth %d; only depth-2 and depth-4 states exist", d)
	}
	// Another model never matches.
	if d, _, _ := c.Longest(BlockKeys(Identity{Model: "other"}, "", turn3, bs)); d != 0 {
		t.Errorf("another model matched depth %d", d)
	}
	if err := c.Forget(k2...); err != nil {
		t.Fatal(err)
	}
	if d, _, _ := c.Longest(k2); d != 0 {
		t.Errorf("after Forget matched depth %d", d)
	}
	if st := c.Stats(); st.Hot.Entries != 0 || st.SSD.Entries != 0 {
		t.Errorf("after Forget: %+v %+v", st.Hot, *st.SSD)
	}
}
