package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/prefixdigest"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/prefixindex/prefixindextest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func TestChoosePrefix(t *testing.T) {
	hot := func(tokens, load int) prefixCandidate {
		return prefixCandidate{hit: prefixindex.Hit{Depth: 2, Held: prefixindex.Held{Tier: runnerapi.TierHot, Tokens: tokens}}, load: load, slots: 1}
	}
	ssd := func(tokens, load int) prefixCandidate {
		c := hot(tokens, load)
		c.hit.Tier = runnerapi.TierSSD
		return c
	}
	none := func(load int) prefixCandidate { return prefixCandidate{load: load, slots: 1} }
	all := func(n int) []bool {
		e := make([]bool, n)
		for i := range e {
			e[i] = true
		}
		return e
	}
	tests := []struct {
		name     string
		cands    []prefixCandidate
		eligible []bool
		want     int
	}{
		{name: "nobody holds anything: fall back", cands: []prefixCandidate{none(0), none(0)}, want: -1},
		{name: "the holder though busier than an idle replica", cands: []prefixCandidate{none(0), hot(1000, 1)}, want: 1},
		{name: "the longest held prefix", cands: []prefixCandidate{hot(1000, 0), hot(4000, 0), hot(2000, 0)}, want: 1},
		{name: "hot beats ssd of the same length", cands: []prefixCandidate{ssd(4000, 0), hot(4000, 0)}, want: 1},
		{name: "a much longer ssd prefix beats a short hot one", cands: []prefixCandidate{hot(1000, 0), ssd(8000, 0)}, want: 1},
		{name: "a loaded holder loses to an idle one holding nearly as much",
			cands: []prefixCandidate{hot(4000, 1), hot(3000, 0), none(0)}, want: 1},
		{name: "equal scores go to the less loaded",
			cands: []prefixCandidate{{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot", Tokens: 100}}, load: 1, slots: 2},
				{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot", Tokens: 100}}, load: 1, slots: 2}}, want: 0},
		{name: "over the load bound the holder spills: fall back",
			cands: []prefixCandidate{hot(8000, 3), none(0), none(0)}, want: -1},
		{name: "over the load bound another holder takes it",
			cands: []prefixCandidate{hot(8000, 3), none(0), ssd(100, 0)}, want: 2},
		{name: "an ineligible holder is never picked",
			cands: []prefixCandidate{hot(8000, 0), hot(10, 0)}, eligible: []bool{false, true}, want: 1},
		{name: "depth counts when tokens are not reported",
			cands: []prefixCandidate{{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot"}}, slots: 1},
				{hit: prefixindex.Hit{Depth: 3, Held: prefixindex.Held{Tier: "hot"}}, slots: 1}}, want: 1},
		{name: "nothing eligible", cands: []prefixCandidate{hot(1, 0)}, eligible: []bool{false}, want: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.eligible
			if e == nil {
				e = all(len(tc.cands))
			}
			wantChoice(t, tc.cands, e, tc.want)
		})
	}
}

// wantChoice checks that choosePrefix picks want of cands, showing the scores when not.
func wantChoice(t *testing.T, cands []prefixCandidate, eligible []bool, want int) {
	t.Helper()
	if got := choosePrefix(cands, eligible, DefaultLoadBound); got != want {
		scores := make([]float64, len(cands))
		for i, c := range cands {
			scores[i] = prefixScore(c)
		}
		t.Errorf("choosePrefix = %d, want %d (scores %v)", got, want, scores)
	}
}

func TestResolveRouting(t *testing.T) {
	tests := []struct {
		routing        string
		set, affinity  bool
		want           Routing
		wantErrContain string
	}{
		{routing: "prefix-cache", want: RoutingPrefixCache},
		{routing: "least-load", set: true, want: RoutingLeastLoad},
		{routing: "prefix-cache", affinity: true, want: RoutingPrefixAffinity},
		{routing: "prefix-affinity", set: true, affinity: true, want: RoutingPrefixAffinity},
		{routing: "least-load", set: true, affinity: true, wantErrContain: "--routing=prefix-affinity"},
		{routing: "random", set: true, wantErrContain: "prefix-cache, prefix-affinity, least-load"},
	}
	for _, tc := range tests {
		got, err := ResolveRouting(tc.routing, tc.set, tc.affinity)
		if tc.wantErrContain != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrContain) {
				t.Errorf("ResolveRouting(%q, %v, %v) = %v, %v; want an error naming %q", tc.routing, tc.set, tc.affinity, got, err, tc.wantErrContain)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ResolveRouting(%q, %v, %v) = %v, %v; want %v", tc.routing, tc.set, tc.affinity, got, err, tc.want)
		}
	}
}

// cacheAgent is an httptest agent whose runner "caches" every request it serves: it
// reports the request's prefix digests as held (hot) through its prefix events, and
// holds a request whose last message says "hold" until released.
type cacheAgent struct {
	*upstream
	events *prefixindextest.Agent

	mu      sync.Mutex
	digests []string // the header of each request served
	release chan struct{}
	held    chan struct{}
}

func newCacheAgent(t *testing.T, key string) *cacheAgent {
	a := &cacheAgent{events: prefixindextest.New(key, "epoch-"+key), release: make(chan struct{}), held: make(chan struct{}, 8)}
	a.upstream = newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/models/") {
			a.events.Handler().ServeHTTP(w, r)
			return
		}
		h := r.Header.Get(runnerapi.HeaderPrefixDigests)
		a.mu.Lock()
		a.digests = append(a.digests, h)
		a.mu.Unlock()
		var evs []runnerapi.PrefixEvent
		for i, d := range strings.Split(h, ",") {
			if d != "" {
				evs = append(evs, runnerapi.PrefixEvent{Digest: d, Tier: runnerapi.TierHot, Tokens: 1000 * (i + 1)})
			}
		}
		a.events.Publish(evs...)
		if r.Header.Get("X-Test-Hold") != "" {
			a.held <- struct{}{}
			<-a.release
		}
		okJSON(w, r)
	})
	return a
}

func (a *cacheAgent) lastDigests() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.digests[len(a.digests)-1]
}

// TestPrefixCacheRouting: under RoutingPrefixCache the gateway sends each request's
// prefix digests to the agent (never a client's), learns from the agents' prefix
// events what each replica holds, and routes a conversation's next turn — through any
// of the three chat APIs — and another user's request with the same system prompt to
// the replica that holds them, even while that replica is busier than the other.
func TestPrefixCacheRouting(t *testing.T) {
	agents := []*cacheAgent{newCacheAgent(t, "a/r0"), newCacheAgent(t, "a/r1")}
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache, MaxInFlightPerSlot: 2})
	t.Cleanup(g.Close)
	g.serveReplicas(agents[0].host(), agents[1].host())
	system := `{"role":"system","content":"You review Go code. ` + strings.Repeat("Be precise. ", 50) + `"}`
	turn1 := `{"model":"m","messages":[` + system + `,{"role":"user","content":"Review main.go"}]}`
	_, got := post(t, g.url, turn1, runnerapi.HeaderPrefixDigests, "0123456789abcdef")
	home := map[string]int{`{"replica":"a/r0"}`: 0, `{"replica":"a/r1"}`: 1}[got]
	holder, other := agents[home], agents[1-home]
	want := strings.Join(prefixdigest.Of("", "a/m", []byte(turn1)), ",")
	if h := holder.lastDigests(); h != want || strings.Contains(h, "0123456789abcdef") {
		t.Fatalf("the agent got digests %q, want the gateway's %q", h, want)
	}
	holderKey := []string{"a/r0", "a/r1"}[home]
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return g.bal.index.Len(holderKey) == 2, "not yet: the index learns what the holder holds"
	})

	// Keep the holder busy with one request: least load would now pick the other.
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(t, g.url, turn1, "X-Test-Hold", "1")
	}()
	select {
	case <-holder.held:
	case <-other.held:
		close(other.release)
		t.Fatal("the request of the held conversation went to the replica that does not hold it")
	case <-time.After(10 * time.Second):
		t.Fatal("the held request reached no replica")
	}
	turn2 := strings.TrimSuffix(turn1, "]}") + `,{"role":"assistant","content":"Looks fine."},{"role":"user","content":"And util.go?"}]}`
	anthropicTurn2 := `{"model":"m","max_tokens":100,"system":"` + strings.TrimSuffix(strings.TrimPrefix(system, `{"role":"system","content":"`), `"}`) +
		`","messages":[{"role":"user","content":"Review main.go"},{"role":"assistant","content":"Looks fine."},{"role":"user","content":"And util.go?"}]}`
	otherUser := `{"model":"m","messages":[` + system + `,{"role":"user","content":"Review db.go"}]}`
	for _, req := range []struct{ name, path, body string }{
		{"the second turn", "/v1/chat/completions", turn2},
		{"the second turn through Anthropic Messages", "/v1/messages", anthropicTurn2},
		{"another user's request with the same system prompt", "/v1/chat/completions", otherUser},
	} {
		if _, got := postPath(t, g.url+req.path, req.body); got != fmt.Sprintf(`{"replica":%q}`, holderKey) {
			t.Errorf("%s went to %s, not to the holder %s", req.name, got, holderKey)
		}
	}
	if h := holder.lastDigests(); !strings.HasPrefix(h, strings.Split(want, ",")[0]) {
		t.Errorf("another user's digests %q do not start with the shared head %q", h, want)
	}
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routedPrefixHit)); n != 4 {
		t.Errorf("%v requests routed by a prefix hit, want 4 (the held one and three)", n)
	}
	// A conversation nobody holds is routed by the fallback.
	post(t, g.url, `{"model":"m","messages":[{"role":"user","content":"unrelated"}]}`)
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routedFallback)); n != 2 {
		t.Errorf("%v requests routed by the fallback, want 2 (the first turn and the unrelated one)", n)
	}
	close(holder.release)
	<-done
	if len(other.digests) > 1 {
		t.Errorf("the other replica served %d requests, want at most the unrelated one", len(other.digests))
	}
}

// TestPrefixCacheOff: a deployment whose prompt cache is off is routed by least load,
// with no digests sent (not even a client's) and no agent polled.
func TestPrefixCacheOff(t *testing.T) {
	agents := []*cacheAgent{newCacheAgent(t, "a/r0"), newCacheAgent(t, "a/r1")}
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache})
	t.Cleanup(g.Close)
	d := deployment("a", "m", "")
	d.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false)}
	g.SetTable(BuildTable([]mfv1.ModelDeployment{d}, []mfv1.ModelReplica{
		replica("a", "r0", "m", "mac", agents[0].host(), metav1.ConditionTrue),
		replica("a", "r1", "m", "mac", agents[1].host(), metav1.ConditionTrue)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	seen := map[string]int{}
	for range 4 {
		_, got := post(t, g.url, chatBody, runnerapi.HeaderPrefixDigests, "0123456789abcdef")
		seen[got]++
	}
	if len(seen) != 2 {
		t.Errorf("4 sequential requests went to %v, want both replicas (least load)", seen)
	}
	for _, a := range agents {
		if h := a.lastDigests(); h != "" {
			t.Errorf("digests %q sent for a deployment without a prompt cache", h)
		}
		if p := a.events.Polls(); len(p) != 0 {
			t.Errorf("an agent was polled for a deployment without a prompt cache: %v", p)
		}
	}
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routedLeastLoad)); n != 4 {
		t.Errorf("%v requests routed by least load, want 4", n)
	}
}

// TestPrefixCacheFallback: with no replica holding a conversation, prefix-cache
// routing keeps requests that share a prompt_cache_key on one replica (whatever their
// prompts; different keys spread) and spreads requests without one by least load.
// The record of prefixes in flight is off: the requests share their prompts, and a
// replica prefilling one (or just done with it) draws the next whether or not it has
// a slot free, since the runner shares an in-flight prefix (TestPrefixScoreInFlight).
func TestPrefixCacheFallback(t *testing.T) {
	h := func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) }
	ups := []*upstream{newUpstream(t, h), newUpstream(t, h), newUpstream(t, h)}
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache, NoInFlightPrefixes: true})
	t.Cleanup(g.Close)
	g.serveReplicas(ups[0].host(), ups[1].host(), ups[2].host())
	homes := map[string]bool{}
	for k := range 12 {
		var home string
		for i := range 3 {
			body := fmt.Sprintf(`{"model":"m","prompt_cache_key":"thread-%d","messages":[{"role":"user","content":"q%d"}]}`, k, i)
			if _, got := post(t, g.url, body); i == 0 {
				home = got
			} else if got != home {
				t.Errorf("key %d: request %d went to %s, the first to %s", k, i, got, home)
			}
		}
		homes[home] = true
	}
	if len(homes) < 2 {
		t.Errorf("12 keys all went to %v", homes)
	}
	seen := map[string]int{}
	for range 6 {
		_, got := post(t, g.url, chatBody)
		seen[got]++
	}
	if len(seen) != 3 {
		t.Errorf("6 sequential requests without a key went to %v, want all three replicas (least load)", seen)
	}
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routedFallback)); n != 42 {
		t.Errorf("%v requests routed by the fallback, want all 42", n)
	}
}
