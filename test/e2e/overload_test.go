package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// Bounds of TestOverloadIsolatesModels.
const (
	// overloadQueue is the flooded deployment's queue bound; a quarter of it per
	// client (one), so each flooding client has at most one request waiting.
	overloadQueue = 4
	// floodClients send the flooded model one request at a time each, from their own
	// loopback addresses: two on the replica's slots, four waiting, six turned away.
	floodClients = 12
	// floodRequests bounds each flooding client's requests.
	floodRequests = 400
	// steadyBaseline is how many requests measure the other model's latency before
	// the flood; at least as many are sent during it.
	steadyBaseline = 30
	// steadyMax bounds the other model's requests during the flood: they take tens of
	// milliseconds, and the refused flooding clients come back after their Retry-After
	// (up to 5 s while the queue has not moved yet).
	steadyMax = 5000
	// refusalsDuring and servedDuring are how many 429s the flooded model must give,
	// and how many of its requests must end (each letting a waiting one out of its
	// queue), while the other model is being served, so that the two overlap for
	// certain.
	refusalsDuring = 2
	servedDuring   = 2
)

// TestOverloadIsolatesModels: an overloaded model answers 429 with Retry-After while
// another model on the same fleet keeps its latency (issue 10). Two deployments; twelve
// clients flood the first, each sending long requests one after another and, when
// turned away, waiting the Retry-After it was given, as the OpenAI SDKs do. Its replica
// takes two, its queue four; the rest get a 429 whose body is the OpenAI error
// (rate_limit_error, queue_full) and whose Retry-After is whole seconds. Meanwhile a
// client of the second model is served every time, and none of its requests waits in
// the gateway: its queue-wait histogram has no observation (the flooded model's has
// many) and its queue stays empty while the flooded one stays full.
//
// Its wall-clock latency is only logged: on one machine, both simulated Macs share
// the same cores, so the flooded model's runner slows the other's by CPU contention
// the gateway cannot prevent. What the gateway decides — admit, queue, refuse — is
// what is asserted.
func TestOverloadIsolatesModels(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	// engine.parallel 2 for both; a long context for the flooded one, so that its
	// requests last long enough to keep its queue full.
	create(t, deployment(ns, "flooded", 1, func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 8192 }))
	create(t, deployment(ns, "steady", 1))
	waitReady(t, ns, "flooded", 1, 3*time.Minute)
	waitReady(t, ns, "steady", 1, 3*time.Minute)
	flooded, steady := ns+"/flooded", ns+"/steady"
	url, reg := queueGateway(t, gateway.DefaultMaxInFlightPerSlot, fairqueue.Limits{MaxQueued: overloadQueue})

	steadyClient := clientFrom(url, "127.0.0.3", 0)
	askSteady := func() (time.Duration, error) {
		start := time.Now()
		_, err := chat(t.Context(), steadyClient, steady, false)
		return time.Since(start), err
	}
	for _, m := range []string{flooded, steady} {
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			_, err := chat(t.Context(), steadyClient, m, false)
			return err == nil, fmt.Sprintf("the gateway does not serve %s yet: %v", m, err)
		})
	}
	// Warm up, then measure.
	for range steadyBaseline {
		if _, err := askSteady(); err != nil {
			t.Fatalf("%s before the flood: %v", steady, err)
		}
	}
	var before []time.Duration
	for range steadyBaseline {
		d, err := askSteady()
		if err != nil {
			t.Fatalf("%s before the flood: %v", steady, err)
		}
		before = append(before, d)
	}

	metric := func(name, model string, extra ...string) float64 {
		labels := map[string]string{"model": model}
		for i := 0; i+1 < len(extra); i += 2 {
			labels[extra[i]] = extra[i+1]
		}
		return metricValue(t, reg, name, labels)
	}
	depth := func(model string) float64 { return metric("macfleet_gateway_queue_depth", model) }
	refusals := func() float64 {
		return metric("macfleet_gateway_queue_rejections_total", flooded, "reason", "queue_full")
	}

	// The flood.
	ctx, cancel := context.WithCancel(t.Context())
	var flood sync.WaitGroup
	stopFlood := func() {
		cancel()
		flood.Wait()
	}
	defer stopFlood()
	var refused, served atomic.Int64
	var retryMu sync.Mutex
	var retries []time.Duration
	for i := range floodClients {
		flood.Go(func() {
			hc := httpClientFrom("127.0.1." + strconv.Itoa(i+1))
			for range floodRequests {
				retry, err := floodOnce(ctx, hc, url, flooded)
				switch {
				case ctx.Err() != nil:
					return
				case err != nil:
					t.Errorf("flooding client %d: %v", i, err)
					cancel()
					return
				case retry == 0:
					served.Add(1)
					continue
				}
				refused.Add(1)
				retryMu.Lock()
				retries = append(retries, retry)
				retryMu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
			}
		})
	}
	// Overloaded: its queue full, and the clients that found it full refused (so that
	// the 429s counted next are of clients coming back after their Retry-After).
	testenv.Eventually(t, time.Minute, 5*time.Millisecond, func() (bool, string) {
		return depth(flooded) == overloadQueue && refused.Load() >= floodClients-2-overloadQueue, fmt.Sprintf(
			"%v of %s's requests waiting (want %d), %d refused (want %d), %d served", depth(flooded), flooded, overloadQueue,
			refused.Load(), floodClients-2-overloadQueue, served.Load())
	})

	// The other model, while the flood lasts.
	var during []time.Duration
	var floodedDepths []float64
	refusedBefore, servedBefore := refusals(), served.Load()
	deadline := time.Now().Add(2 * time.Minute)
	for len(during) < steadyBaseline || refusals() < refusedBefore+refusalsDuring || served.Load() < servedBefore+servedDuring {
		if ctx.Err() != nil {
			t.FailNow() // a flooding client failed, and said why
		}
		if len(during) == steadyMax || time.Now().After(deadline) {
			t.Fatalf("after %d requests of %s, %s refused %v more (want %d) and served %d more (want %d): the two did not overlap",
				len(during), steady, flooded, refusals()-refusedBefore, refusalsDuring, served.Load()-servedBefore, servedDuring)
		}
		floodedDepths = append(floodedDepths, depth(flooded))
		d, err := askSteady()
		if err != nil {
			t.Errorf("%s during the flood of %s (request %d): %v", steady, flooded, len(during)+1, err)
			break
		}
		if q := depth(steady); q != 0 {
			t.Errorf("%v requests of %s wait in the gateway's queue during the flood of %s, want none", q, steady, flooded)
			break
		}
		during = append(during, d)
	}
	stopFlood()

	if slices.Min(floodedDepths) == 0 {
		t.Errorf("%s's queue emptied while %s was served (depths %v): it was not overloaded throughout", flooded, steady, floodedDepths)
	}
	if n := metric("macfleet_gateway_queue_wait_seconds", steady); n != 0 {
		t.Errorf("%v requests of %s waited in the gateway's queue, want none", n, steady)
	}
	if n := metric("macfleet_gateway_queue_wait_seconds", flooded); n == 0 {
		t.Errorf("no request of %s waited in the gateway's queue: the flood did not overload it", flooded)
	}
	for _, name := range []string{"macfleet_gateway_queue_rejections_total", "macfleet_gateway_errors_total"} {
		if n := metric(name, steady); n != 0 {
			t.Errorf("%s{model=%q} = %v, want 0", name, steady, n)
		}
	}
	if got, seen := refusals(), float64(refused.Load()); got < seen || seen == 0 {
		t.Errorf("%s: %v 429s counted by the gateway, %v seen by the clients; want at least one, all counted", flooded, got, seen)
	}
	if len(during) == 0 || len(retries) == 0 {
		return
	}
	t.Logf("%s: %d requests served, %d refused with 429 (Retry-After %v–%v), queue depth %v–%v while %s was served",
		flooded, served.Load(), refused.Load(), slices.Min(retries), slices.Max(retries),
		slices.Min(floodedDepths), slices.Max(floodedDepths), steady)
	for _, p := range []float64{0.5, 0.9} {
		b, d := pctl(before, p), pctl(during, p)
		t.Logf("%s: p%.0f latency %v before the flood (%d requests), %v during it (%d requests): %.2fx (CPU shared with the flood's runner)",
			steady, 100*p, b.Round(100*time.Microsecond), len(before), d.Round(100*time.Microsecond), len(during), float64(d)/float64(b))
	}
}

// floodOnce sends one long chat completion for model through the gateway at base. It
// returns 0 when it was served, the Retry-After when it was refused with a 429 in the
// OpenAI error shape, and an error for anything else.
func floodOnce(ctx context.Context, hc *http.Client, base, model string) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2000,"temperature":0,"messages":[{"role":"user","content":"Tell a long story"}]}`, model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return 0, nil
	case http.StatusTooManyRequests:
	default:
		return 0, fmt.Errorf("status %d, want 200 or 429: %s", resp.StatusCode, data)
	}
	var e struct {
		Error struct {
			Type, Code, Message string
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "queue_full" ||
		!strings.Contains(e.Error.Message, model) || resp.Header.Get("Content-Type") != "application/json" {
		return 0, fmt.Errorf("429 with body %s (%v), want an OpenAI rate_limit_error, code queue_full, naming %s", data, err, model)
	}
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || secs < 1 || secs > 60 {
		return 0, fmt.Errorf("429 with Retry-After %q, want whole seconds from 1 to 60", resp.Header.Get("Retry-After"))
	}
	return time.Duration(secs) * time.Second, nil
}
