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
	"github.com/macfleet/macfleet/gateway/prefixindex/prefixindextest"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/test/support/testenv"
)

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
		return g.bal.Index().Len(holderKey) == 2, "not yet: the index learns what the holder holds"
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
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedPrefixHit)); n != 4 {
		t.Errorf("%v requests routed by a prefix hit, want 4 (the held one and three)", n)
	}
	// A conversation nobody holds is routed by the fallback.
	post(t, g.url, `{"model":"m","messages":[{"role":"user","content":"unrelated"}]}`)
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedFallback)); n != 2 {
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
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedLeastLoad)); n != 4 {
		t.Errorf("%v requests routed by least load, want 4", n)
	}
}

// TestPrefixCacheFallback: with no replica holding a conversation, prefix-cache
// routing keeps requests that share a prompt_cache_key on one replica (whatever their
// prompts; different keys spread) and spreads requests without one by least load.
// Every conversation is its own: one sent before counts as held by the replica that
// prefilled it until the index hears of the save (the in-flight record), which these
// upstreams never report.
func TestPrefixCacheFallback(t *testing.T) {
	h := func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) }
	ups := []*upstream{newUpstream(t, h), newUpstream(t, h), newUpstream(t, h)}
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache})
	t.Cleanup(g.Close)
	g.serveReplicas(ups[0].host(), ups[1].host(), ups[2].host())
	homes := map[string]bool{}
	for k := range 12 {
		var home string
		for i := range 3 {
			body := fmt.Sprintf(`{"model":"m","prompt_cache_key":"thread-%d","messages":[{"role":"user","content":"q%d of thread %d"}]}`, k, i, k)
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
	for i := range 6 {
		_, got := post(t, g.url, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i))
		seen[got]++
	}
	if len(seen) != 3 {
		t.Errorf("6 sequential requests without a key went to %v, want all three replicas (least load)", seen)
	}
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedFallback)); n != 42 {
		t.Errorf("%v requests routed by the fallback, want all 42", n)
	}
}
