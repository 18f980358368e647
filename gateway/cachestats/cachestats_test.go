package cachestats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/console"
	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// statsReplica is replica name of deployment dep on the agent at endpoint, Ready or not.
func statsReplica(name, dep, endpoint string, ready bool) mfv1.ModelReplica {
	r := mfv1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{mfv1.LabelDeployment: dep}}}
	r.Spec.NodeName = "mac-" + endpoint
	r.Status.Endpoint = endpoint
	st := metav1.ConditionFalse
	if ready {
		st = metav1.ConditionTrue
	}
	r.Status.Conditions = []metav1.Condition{{Type: mfv1.ReplicaReady, Status: st}}
	return r
}

func TestSumPromptCache(t *testing.T) {
	replicas := []mfv1.ModelReplica{
		statsReplica("a-0", "a", "agent-1", true),
		statsReplica("a-1", "a", "agent-2", true),
		statsReplica("a-2", "a", "agent-3", true),  // its agent did not answer
		statsReplica("a-3", "a", "agent-1", false), // not Ready: not counted
		statsReplica("b-0", "b", "agent-1", true),  // its runner reports no counters
		statsReplica("c-0", "c", "serve", true),    // `macfleet serve` names the model "c"
	}
	byAgent := map[string]map[string]console.PromptCache{
		"agent-1": {"ns/a-0": {HotHits: 3, HotMisses: 2, SSDHits: 1, RestoredTokens: 100, Replicas: 1},
			"ns/a-3": {HotHits: 1000, Replicas: 1}},
		"agent-2": {"ns/a-1": {HotHits: 1, HotMisses: 4, SSDHits: 2, RestoredTokens: 50, Replicas: 1}},
		"serve":   {"c": {HotHits: 7, Replicas: 1}},
	}
	want := map[string]console.PromptCache{"ns/a": {HotHits: 4, HotMisses: 6, SSDHits: 3, RestoredTokens: 150, Replicas: 2, Unreported: 1},
		"ns/c": {HotHits: 7, Replicas: 1}}
	if d := cmp.Diff(want, sumPromptCache(replicas, byAgent)); d != "" {
		t.Errorf("sums (-want +got):\n%s", d)
	}
}

func TestCacheStatsReusesAnAnswerForItsTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	var asked []prefixindex.Target
	fail := false
	c := &Stats{now: func() time.Time { return now }, fetch: func(_ context.Context, tg prefixindex.Target) (agentStatus, error) {
		asked = append(asked, tg)
		if fail {
			return agentStatus{}, errors.New("down")
		}
		return agentStatus{Models: []modelStatus{{Name: "ns/a-0", PromptCache: &runnerCacheStats{HotHits: int64(len(asked))}}}}, nil
	}}
	reps := []mfv1.ModelReplica{statsReplica("a-0", "a", "agent-1", true)}
	read := func() console.PromptCache { return c.Read(t.Context(), reps)["ns/a"] }
	if got := read(); got.HotHits != 1 || len(asked) != 1 || asked[0] != (prefixindex.Target{Key: "ns/a-0", Endpoint: "agent-1", Node: "mac-agent-1"}) {
		t.Fatalf("first read %+v, asked %+v", got, asked)
	}
	now = now.Add(cacheStatsTTL - time.Millisecond)
	if got := read(); got.HotHits != 1 || len(asked) != 1 {
		t.Errorf("within the TTL: %+v, asked %d times, want the first answer and no new ask", got, len(asked))
	}
	now = now.Add(time.Millisecond)
	if got := read(); got.HotHits != 2 || len(asked) != 2 {
		t.Errorf("after the TTL: %+v, asked %d times, want a new answer", got, len(asked))
	}
	fail, now = true, now.Add(cacheStatsTTL)
	if got := read(); !cmp.Equal(got, console.PromptCache{Unreported: 1}) {
		t.Errorf("agent down: %+v, want the replica unreported", got)
	}
}

// TestAgentStatusCountsPeerFetches: an agent's peer fetches join its model's prompt
// cache counters; those of a model without counters are not shown on their own.
func TestAgentStatusCountsPeerFetches(t *testing.T) {
	st := agentStatus{Models: []modelStatus{{Name: "ns/a-0", PromptCache: &runnerCacheStats{HotHits: 2}}, {Name: "ns/b-0"}},
		PeerFetches: map[string]agentPeerFetches{
			"ns/a-0": {Bytes: 4096, Results: map[string]int64{"imported": 1, "not_found": 2}},
			"ns/b-0": {Bytes: 1, Results: map[string]int64{"imported": 1}},
		}}
	want := map[string]console.PromptCache{"ns/a-0": {HotHits: 2, Replicas: 1, PeerBytes: 4096,
		PeerFetches: map[string]int64{"imported": 1, "not_found": 2}}}
	if d := cmp.Diff(want, st.counters()); d != "" {
		t.Errorf("counters (-want +got):\n%s", d)
	}
}
