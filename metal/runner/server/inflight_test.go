package server

import (
	"testing"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// keysOf is the block keys of a prompt of the given blocks (one token each, block
// size 1) in partition p.
func keysOf(p string, blocks ...int32) []promptcache.Key {
	return promptcache.BlockKeys(promptcache.Identity{Model: "m", Format: "f"}, p, blocks, 1)
}

func TestChooseLeader(t *testing.T) {
	const block = 64
	job := keysOf("team-a", 1, 2, 3, 4, 5, 6) // 6 blocks
	cases := []struct {
		name  string
		keep  int
		slots []prefilling
		want  leaderChoice
	}{
		{name: "nobody prefilling", want: leaderChoice{slot: -1}},
		{name: "a slot prefilling the same system prompt",
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2, 3, 4, 9), fed: 64}},
			want:  leaderChoice{slot: 1, shared: 4 * block}},
		{name: "not a full block in common",
			slots: []prefilling{{slot: 0, keys: keysOf("team-a", 7, 2, 3), fed: 128}},
			want:  leaderChoice{slot: -1}},
		{name: "another partition's identical prompt is never shared",
			slots: []prefilling{{slot: 0, keys: keysOf("team-b", 1, 2, 3, 4, 5, 6), fed: 300}},
			want:  leaderChoice{slot: -1}},
		{name: "the job holds the shared tokens already (a cached prefix)", keep: 4 * block,
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2, 3, 4, 9), fed: 200}},
			want:  leaderChoice{slot: -1}},
		{name: "the job holds part of them: it waits for the rest", keep: 2 * block,
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2, 3, 4, 9), fed: 200}},
			want:  leaderChoice{slot: 1, shared: 4 * block}},
		{name: "a leader behind the job's own prefill is no help", keep: 2 * block,
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2, 3, 4, 9), fed: block}},
			want:  leaderChoice{slot: -1}},
		{name: "a leader even with it: waiting spares the shared steps", keep: 2 * block,
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2, 3, 4, 9), fed: 2 * block}},
			want:  leaderChoice{slot: 1, shared: 4 * block}},
		{name: "a leader that fed nothing yet is even with an empty slot",
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2), fed: 0}},
			want:  leaderChoice{slot: 1, shared: 2 * block}},
		{name: "a leader one token in is ahead",
			slots: []prefilling{{slot: 1, keys: keysOf("team-a", 1, 2), fed: 1}},
			want:  leaderChoice{slot: 1, shared: 2 * block}},
		{name: "a slot generating after the same system prompt: shared at once",
			slots: []prefilling{{slot: 0, keys: keysOf("team-a", 1, 2, 3, 8), fed: 4*block + 10}},
			want:  leaderChoice{slot: 0, shared: 3 * block}},
		{name: "the deepest share wins",
			slots: []prefilling{{slot: 0, keys: keysOf("team-a", 1, 2), fed: 100}, {slot: 2, keys: keysOf("team-a", 1, 2, 3, 4, 5), fed: 10}},
			want:  leaderChoice{slot: 2, shared: 5 * block}},
		{name: "equal shares: the slot that fed more",
			slots: []prefilling{{slot: 0, keys: keysOf("team-a", 1, 2, 3), fed: 10}, {slot: 1, keys: keysOf("team-a", 1, 2, 3), fed: 150}},
			want:  leaderChoice{slot: 1, shared: 3 * block}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := chooseLeader(job, c.keep, block, c.slots); got != c.want {
				t.Errorf("chooseLeader = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestHoldNext(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 21, 0, 0, 0, time.UTC)
	h := holdState{shared: 1024, own: 1024, since: t0}
	ms := time.Millisecond
	cases := []struct {
		name      string
		live      bool
		fed       int
		now       time.Time
		perToken  time.Duration
		want      holdVerdict
		wantLimit time.Duration
	}{
		{name: "the leader is still prefilling the shared part", live: true, fed: 512, now: t0.Add(time.Second), perToken: ms, want: holdWait},
		{name: "the leader fed the shared tokens", live: true, fed: 1024, now: t0.Add(time.Second), perToken: ms, want: holdShare},
		{name: "the leader is generating", live: true, fed: 2000, now: t0.Add(time.Second), perToken: ms, want: holdShare},
		{name: "the leader's job failed or was cancelled", live: false, fed: 512, now: t0.Add(time.Second), perToken: ms, want: holdGive},
		{name: "the leader's job ended even after feeding", live: false, fed: 1024, now: t0, perToken: ms, want: holdGive},
		{name: "the wait outlasts prefilling the tokens itself", live: true, fed: 512, now: t0.Add(2049 * ms), perToken: ms, want: holdGive},
		{name: "just within the limit", live: true, fed: 512, now: t0.Add(2048 * ms), perToken: ms, want: holdWait},
		{name: "a deeper, costlier prefill raises the limit", live: true, fed: 900, now: t0.Add(3 * time.Second), perToken: 2 * ms, want: holdWait},
		{name: "unmeasured: the slow fallback", live: true, fed: 10, now: t0.Add(30 * time.Second), want: holdWait},
		{name: "unmeasured, past the fallback", live: true, fed: 10, now: t0.Add(time.Duration(holdSlack*1024+1) * fallbackPerToken), want: holdGive},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := holdNext(h, c.live, c.fed, c.now, c.perToken); got != c.want {
				t.Errorf("holdNext = %d, want %d", got, c.want)
			}
		})
	}
}
