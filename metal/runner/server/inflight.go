package server

import (
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// Sharing an in-flight prefix: a job whose prompt shares full cache blocks with the
// prompt another slot is prefilling right now does not prefill those blocks a second
// time. It waits in the queue until the other slot (its leader) has fed them, then
// takes their KV from the leader's sequence, restored into its own slot exactly as a
// cached prefix. The decisions below are pure; the engine applies them
// (engine_inflight.go).

// prefilling is what the decision sees of a busy slot: prefilling a prompt, or
// generating after it (fed is then the whole prompt).
type prefilling struct {
	slot int
	// keys are the block keys of its prompt (partition-seeded: a slot of another
	// partition shares none), fed the prompt tokens already in its KV.
	keys []promptcache.Key
	fed  int
}

// leaderChoice is the slot a job waits on and how many prompt tokens they share.
type leaderChoice struct {
	slot   int // -1: none, prefill normally
	shared int
}

// chooseLeader picks the prefilling slot a job with block keys keys should wait on:
// the one sharing the most full blocks (block tokens each) beyond the keep tokens the
// job holds anyway (a cached prefix or its slot's), among those that will have fed the
// shared tokens no later than the job could prefill them itself. Ties go to the slot that has
// fed more.
func chooseLeader(keys []promptcache.Key, keep, block int, slots []prefilling) leaderChoice {
	best := leaderChoice{slot: -1}
	bestFed := -1
	for _, p := range slots {
		shared := commonKeys(keys, p.keys) * block
		if shared <= keep {
			continue
		}
		// The leader still has shared-fed tokens to feed; the job would prefill
		// shared-keep. Waiting pays when the leader is ahead, and when they are even
		// too: the leader then prefills alone, in steps it does not share.
		if shared-min(p.fed, shared) > shared-keep {
			continue
		}
		if shared > best.shared || (shared == best.shared && p.fed > bestFed) {
			best, bestFed = leaderChoice{slot: p.slot, shared: shared}, p.fed
		}
	}
	return best
}

func commonKeys(a, b []promptcache.Key) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// holdVerdict is what a waiting job does at one admission.
type holdVerdict int

const (
	holdWait  holdVerdict = iota // stay queued
	holdShare                    // take the shared tokens' KV from the leader now
	holdGive                     // stop waiting: prefill normally
)

// holdState is a job's wait on a leader, as the decision sees it.
type holdState struct {
	shared int
	// own is how many of the shared tokens the job would prefill itself (those
	// beyond what it holds anyway).
	own   int
	since time.Time
}

// holdNext decides a waiting job's next move: give up when the leader's job ended
// (failed, cancelled or finished: leaderLive false, its slot may hold anything), share
// once the leader has fed the shared tokens, give up when the wait exceeds what
// prefilling its own tokens would take at the prefill's current cost per token
// (perToken), else wait.
func holdNext(h holdState, leaderLive bool, leaderFed int, now time.Time, perToken time.Duration) holdVerdict {
	switch {
	case !leaderLive:
		return holdGive
	case leaderFed >= h.shared:
		return holdShare
	case now.Sub(h.since) > holdLimit(h.own, perToken):
		return holdGive
	}
	return holdWait
}

// holdLimit is how long a job may wait to share tokens it would otherwise prefill
// itself at perToken each (unmeasured yet: fallbackPerToken), with holdSlack for the
// measurement's lag. perToken is measured as the leader goes deeper, where a token
// costs more (attention over more positions) than on average over the prefix: a
// leader that progresses steadily never outlasts the limit.
func holdLimit(tokens int, perToken time.Duration) time.Duration {
	if perToken <= 0 {
		perToken = fallbackPerToken
	}
	return holdSlack * time.Duration(tokens) * perToken
}

// holdSlack is the margin of holdLimit over the estimated prefill time.
const holdSlack = 2

// fallbackPerToken is the prefill time per token assumed before the engine measured
// one: a slow CPU's, so an early wait is not cut short.
const fallbackPerToken = 20 * time.Millisecond
