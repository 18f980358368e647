package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The TTFT tail of issue 26: a tenant's followers share the first prefill, and a cold
// replica fetches a prefix from a peer at the gateway's defaults.

// serving waits until the gateway at base serves model, with a request that shares
// nothing of prefixSystem.
func serving(t *testing.T, base, model string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChat(t.Context(), base, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
}

// longAnswers posts n long answers to prefixSystem in the background, each once the
// one before is in flight (inflight says how many are), and returns a stop that
// cancels them and waits for their end.
func longAnswers(t *testing.T, base, model string, n int, inflight func() float64) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{}, n)
	before := inflight()
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			_, _, _ = postChat(ctx, base, prefixChat(model, 6000, fmt.Sprintf("Tell a very long story about goroutine %d.", i)))
		}()
		testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
			return inflight() == before+float64(i+1), fmt.Sprintf("long answer %d is not in flight (%v)", i+1, inflight())
		})
	}
	return func() {
		cancel()
		for range n {
			<-done
		}
	}
}

// TestPrefixCacheFollowerSharesTheFirstPrefill: a deployment of three replicas (two
// slots each) behind a gateway with --routing=prefix-cache. A request with a long
// system prompt nobody holds lands on some replica R (the fallback) and keeps one of
// its slots with a long answer. Another user's request with the same system prompt,
// sent while the first is in flight, goes to R by the in-flight record
// (prefix_inflight) although the load bound (c 1.25 over three replicas with one
// request in flight: one a replica) would send it elsewhere: R has a slot free. R's
// runner lets it take the first request's KV of the shared prompt instead of
// prefilling it (cached tokens, and the runner's count of shared in-flight prefixes).
func TestPrefixCacheFollowerSharesTheFirstPrefill(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "tail", 3, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.ContextLength = 16384
		md.Spec.Placement.MaxReplicasPerNode = 2 // three replicas on the two simulated Macs
	}))
	replicas := waitReady(t, ns, "tail", 3, 3*time.Minute)
	model := ns + "/tail"
	url, reg := inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache}, testr.New(t))
	routed := func(how string) float64 {
		return metricValue(t, reg, "macfleet_gateway_routing_decisions_total", map[string]string{"model": model, "routing": how})
	}
	inflight := func() float64 {
		return metricValue(t, reg, "macfleet_gateway_inflight", map[string]string{"model": model})
	}
	shares := func() (n int64) {
		for _, r := range replicas {
			if pc, _ := promptCacheOf(t, fleet.Agent(r.Spec.NodeName).Addr, r.Namespace+"/"+r.Name); pc != nil {
				n += pc.InflightShares
			}
		}
		return n
	}
	serving(t, url, model)
	fallbacks, inflights, sharedBefore := routed("fallback"), routed("prefix_inflight"), shares()

	stop := longAnswers(t, url, model, 1, inflight)
	defer stop()
	if n := routed("fallback") - fallbacks; n != 1 {
		t.Fatalf("the first request of the system prompt was routed by the fallback %v times, want 1", n)
	}
	code, text, err := postChat(t.Context(), url, prefixChat(model, 8, "Review this: func f() { go g() }"))
	if err != nil || code != http.StatusOK {
		t.Fatalf("the follower: %d %s (%v)", code, text, err)
	}
	u := answerUsage(t, text)
	t.Logf("the follower: %d prompt tokens (%d cached); routed %v in flight, %v fallback; runners' shared in-flight prefixes %d",
		u.Input, u.Cached, routed("prefix_inflight")-inflights, routed("fallback")-fallbacks, shares()-sharedBefore)
	if n := routed("prefix_inflight") - inflights; n != 1 {
		t.Errorf("the follower was routed by the in-flight record %v times, want 1 (the load bound sent it elsewhere?)", n)
	}
	if u.Cached < u.Input/2 {
		t.Errorf("the follower restored %d of its %d prompt tokens, want at least the shared system prompt (about half)", u.Cached, u.Input)
	}
	if n := shares() - sharedBefore; n != 1 {
		t.Errorf("the runners shared %d in-flight prefixes, want 1 (the follower's)", n)
	}
}

// declareLinks sets spec.link on the Macs of replicas (a 10 Gb/s link, 200 µs) and
// restores what they had when the test ends.
func declareLinks(t *testing.T, replicas []v1alpha1.ModelReplica) {
	t.Helper()
	for _, r := range replicas {
		var mn v1alpha1.MacNode
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: r.Spec.NodeName}, &mn); err != nil {
			t.Fatal(err)
		}
		was := mn.Spec.Link
		patch := client.MergeFrom(mn.DeepCopy())
		mn.Spec.Link = &v1alpha1.Link{Bandwidth: ptr.To(resource.MustParse("10G")), RTT: &metav1.Duration{Duration: 200 * time.Microsecond}}
		if err := fleet.Client.Patch(t.Context(), &mn, patch); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			var now v1alpha1.MacNode
			if err := fleet.Client.Get(context.Background(), client.ObjectKey{Name: mn.Name}, &now); err != nil {
				t.Error(err)
				return
			}
			patch := client.MergeFrom(now.DeepCopy())
			now.Spec.Link = was
			if err := fleet.Client.Patch(context.Background(), &now, patch); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPeerFetchAtTheDefaults: peer fetch as TestPeerFetchRestoresAPrefix sets it up
// (two replicas, one per Mac; the holder P kept busy so that the next request of its
// prefix goes to R, which holds nothing), but with the gateway's default margin: the
// decision is the gateway's own. The Macs declare their link (spec.link, 10 Gb/s),
// and P's runner reports its states' bytes per token with its prefix events: with
// those the gateway estimates the fetch far faster than R's prefill and asks for it;
// with the default of 128 KiB a token it would not (the tiny model's state is about
// half a KiB a token).
func TestPeerFetchAtTheDefaults(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "fetch", 2, func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 16384 }))
	replicas := waitReady(t, ns, "fetch", 2, 3*time.Minute)
	if replicas[0].Spec.NodeName == replicas[1].Spec.NodeName {
		t.Fatalf("both replicas are on %s; the test needs one per Mac", replicas[0].Spec.NodeName)
	}
	declareLinks(t, replicas)
	model := ns + "/fetch"
	base, reg := inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache}, testr.NewWithInterface(t, testr.Options{Verbosity: 2}))
	gw := func(name string, labels map[string]string) float64 {
		labels["model"] = model
		return metricValue(t, reg, name, labels)
	}
	serving(t, base, model)

	turn := prefixChat(model, 16, "Review this: func f() { go g() }")
	// Streamed: the gateway measures the prefill rate from it.
	_, u1 := streamChat(t.Context(), t, base, "", turn)
	var bpt float64
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		for _, r := range replicas {
			var ev runnerapi.PrefixEvents
			if err := agentGet(t.Context(), fleet.Agent(r.Spec.NodeName).Addr, "/api/models/"+url.PathEscape(r.Namespace+"/"+r.Name)+"/prefixes", &ev); err != nil {
				return false, err.Error()
			}
			bpt = max(bpt, ev.BytesPerToken)
		}
		return bpt > 0 && metricValue(t, reg, "macfleet_gateway_prefix_index_entries", nil) > 0,
			fmt.Sprintf("the runner's bytes per token (%v) or the prefix it holds are not reported yet", bpt)
	})
	t.Logf("turn 1: %d prompt tokens (%d cached); the runner reports %.0f bytes a token", u1.Input, u1.Cached, bpt)

	stop := longAnswers(t, base, model, 2, func() float64 { return gw("macfleet_gateway_inflight", map[string]string{}) })
	defer stop()
	code, text, err := postChat(t.Context(), base, turn)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the request for R: %d %s (%v)", code, text, err)
	}
	u2 := answerUsage(t, text)
	t.Logf("on R: %d prompt tokens (%d cached); decisions faster %v, slower %v; fetches imported %v", u2.Input, u2.Cached,
		gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{"decision": "faster"}),
		gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{"decision": "slower"}),
		gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}))
	if n := gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{"decision": "faster"}); n != 1 {
		t.Errorf("the gateway decided %v fetches faster than the prefill, want 1 (by decision: %v)", n,
			gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{}))
	}
	if n := gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}); n != 1 {
		t.Errorf("the gateway counted %v imported peer fetches, want 1", n)
	}
	if u2.Cached < u1.Input/2 {
		t.Errorf("R restored %d of its %d prompt tokens, want at least the system prompt (about half of %d)", u2.Cached, u2.Input, u1.Input)
	}
}
