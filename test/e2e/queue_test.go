package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// queueGateway runs a gateway in this process against the fleet's API server and
// agents, with the given --max-inflight-per-slot, queue bounds and API keys (none: no
// client auth), and returns its URL and metrics registry.
func queueGateway(t testing.TB, perSlot int, limits fairqueue.Limits, keys ...string) (string, *prometheus.Registry) {
	t.Helper()
	keysFile := ""
	if len(keys) > 0 {
		keysFile = filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(keysFile, []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return inProcessGateway(t, gateway.Config{APIKeysFile: keysFile, MaxInFlightPerSlot: perSlot, Queue: limits},
		testr.NewWithInterface(t, testr.Options{}))
}

// inProcessGateway runs a gateway in this process against the fleet's API server and
// agents, with cfg completed by a loopback listener, the fleet token, a registry of
// its own and no console or probes, logging to log. It returns its URL and registry.
func inProcessGateway(t testing.TB, cfg gateway.Config, log logr.Logger) (string, *prometheus.Registry) {
	t.Helper()
	cfg.DisableConsole = true
	return runGateway(t, cfg, log)
}

// runGateway is inProcessGateway with the console as cfg says.
func runGateway(t testing.TB, cfg gateway.Config, log logr.Logger) (string, *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if cfg.RestConfig == nil {
		cfg.RestConfig = fleet.Env.Config
	}
	cfg.Listener, cfg.MetricsAddr, cfg.ProbeAddr = ln, "0", "0"
	cfg.AgentCertSecret, cfg.Registerer = v1alpha1.SystemNamespace+"/"+v1alpha1.GatewayTLSSecret, reg
	// controller-runtime's own logger (the gateway logs through the context's).
	ctrlLogOnce.Do(func() { ctrl.SetLogger(logr.Discard()) })
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), log))
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the gateway: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), reg
}

var ctrlLogOnce sync.Once

// clientFrom is the official OpenAI client calling base from the loopback address ip:
// without API keys, the gateway tells clients apart by address.
func clientFrom(base, ip string, retries int) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(httpClientFrom(ip)), option.WithMaxRetries(retries))
}

// httpClientFrom is an HTTP client whose connections leave from the loopback address ip.
func httpClientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 16}}
}

// metricValue sums the samples of a gauge or counter, and the observation counts of a
// histogram, whose labels include want.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metrics
				}
			}
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// keyClient is the official OpenAI client calling base with an API key.
func keyClient(base, key string, retries int) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(retries))
}

// TestFairQueueUnderOverload: a replica with two sequence slots, one API key with
// eight requests at once and another with one. The gateway sends the replica two at a
// time and queues the rest; the second key's request is served after at most one more
// of the first key's, where the runner's own first-come queue would have served it
// last. A key over its share of the queue gets a 429 with Retry-After through the
// official OpenAI Go client; with their own retries, the Go client and the official
// openai npm package are served.
func TestFairQueueUnderOverload(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	// engine.parallel 2; a long context, so that requests last long enough (about a
	// second each here) for the test to see the queue full before it moves.
	create(t, deployment(ns, "busy", 1, func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 8192 }))
	waitReady(t, ns, "busy", 1, 3*time.Minute)
	model := ns + "/busy"
	url, reg := queueGateway(t, 0, fairqueue.Limits{MaxQueued: 16, MaxPerFlow: 6}, "key-heavy", "key-light")
	heavy, light := keyClient(url, "key-heavy", 0), keyClient(url, "key-light", 0)
	const long = 4000 // tokens
	askCtx := func(ctx context.Context, c openai.Client, maxTokens int) error {
		_, err := c.Chat.Completions.New(ctx, params(t, fmt.Sprintf(
			`{"model":%q,"max_tokens":%d,"temperature":0,"messages":[{"role":"user","content":"Tell a long story"}]}`,
			model, maxTokens)))
		return err
	}
	ask := func(c openai.Client, maxTokens int) error { return askCtx(t.Context(), c, maxTokens) }
	// The heavy key checks the gateway serves: the light key must not be active yet, or
	// the heavy key's burst would leave a slot for it (fairqueue.Share).
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		err := ask(heavy, 1)
		return err == nil, fmt.Sprintf("the gateway does not serve %s yet: %v", model, err)
	})
	depth := func() float64 {
		return metricValue(t, reg, "macfleet_gateway_queue_depth", map[string]string{"model": model})
	}
	refusals := func() float64 {
		return metricValue(t, reg, "macfleet_gateway_queue_rejections_total",
			map[string]string{"model": model, "reason": "queue_full_client"})
	}

	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	run := func(c openai.Client, tag string, tokens int) {
		wg.Go(func() {
			err := ask(c, tokens)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("%s: %v", tag, err)
			}
			order = append(order, tag)
		})
	}
	// burst sends 8 requests of the heavy key at once; longer ones leave a client that
	// starts a process (node) the time to find the queue still full.
	burst := func(prefix string, tokens int) {
		for i := range 8 {
			run(heavy, prefix+strconv.Itoa(i), tokens)
		}
		// Two on the replica's slots, six waiting: the most one key may have.
		testenv.Eventually(t, 30*time.Second, 2*time.Millisecond, func() (bool, string) {
			return depth() == 6, fmt.Sprintf("%v requests queued, want 6 (%v in the gateway, %v answered)", depth(),
				metricValue(t, reg, "macfleet_gateway_inflight", map[string]string{"model": model}),
				metricValue(t, reg, "macfleet_gateway_requests_total", map[string]string{"model": model}))
		})
	}
	burst("a", long)
	var refused *openai.Error
	err := ask(heavy, 8)
	if !errors.As(err, &refused) || refused.StatusCode != http.StatusTooManyRequests || refused.Code != "queue_full" ||
		refused.Response.Header.Get("Retry-After") == "" {
		t.Errorf("a ninth request of the same key: %v, want a 429 queue_full with Retry-After", err)
	}
	run(light, "b", 16)
	wg.Wait()
	rank := slices.Index(order, "b") + 1
	t.Logf("completion order: %v", order)
	// b arrived with two a's on the slots and six waiting: it is the second request
	// the queue hands out, so at most three a's end before it (four, if b and the a
	// that started with it end in the other order). First come, first served: ninth.
	if rank < 1 || rank > 5 {
		t.Errorf("the other key's request ended %d of 9, want among the first 5", rank)
	}
	if got := refusals(); got != 1 {
		t.Errorf("queue_full_client rejections = %v, want 1", got)
	}

	// Clients that retry, refused first: while 10 workers of the heavy key keep its
	// share of the queue full (two on the slots, six waiting, two bouncing off with
	// 429s to fill the gap a dispatch leaves at once; long requests make dispatches,
	// and so gaps, rare), a batch request of the same key is refused; the workers stop
	// and their requests end once it is, and the client's own retry, after the
	// Retry-After, is served. Batch labels the refusal apart from the workers'.
	batchRefusals := func() float64 {
		return metricValue(t, reg, "macfleet_gateway_queue_rejections_total",
			map[string]string{"model": model, "reason": "queue_full_client", "priority": "batch"})
	}
	retried := func(name string, client func() error) {
		t.Helper()
		before := batchRefusals()
		stop := make(chan struct{})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var fill sync.WaitGroup
		for range 10 {
			fill.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					var e *openai.Error
					err := askCtx(ctx, heavy, long)
					if err != nil && !(errors.As(err, &e) && e.StatusCode == http.StatusTooManyRequests) && ctx.Err() == nil {
						t.Errorf("filling the queue: %v", err)
						return
					}
				}
			})
		}
		testenv.Eventually(t, 30*time.Second, 2*time.Millisecond, func() (bool, string) {
			return depth() == 6, fmt.Sprintf("%v requests queued, want 6", depth())
		})
		done := make(chan error, 1)
		go func() { done <- client() }()
		testenv.Eventually(t, 30*time.Second, 2*time.Millisecond, func() (bool, string) {
			return batchRefusals() > before, fmt.Sprintf("%s: not refused yet", name)
		})
		// The workers stop, and their requests still waiting or generating end.
		close(stop)
		cancel()
		fill.Wait()
		if err := <-done; err != nil {
			t.Errorf("%s, retrying after a 429: %v", name, err)
		}
	}
	retried("the OpenAI Go client", func() error {
		c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("key-heavy"), option.WithMaxRetries(5),
			option.WithHeader(gateway.HeaderPriority, "batch"))
		return ask(c, 8)
	})
	node := nodeScript(t, "openai-node-retry.cjs", url+"/v1", "key-heavy", model, "PRIORITY=batch")
	retried("the openai npm package", func() error { return runNode(t, node) })
}

// BenchmarkFairQueue: what the queue changes for a light client while a heavy one
// keeps eight requests in flight on a replica with two slots. Each round runs the same
// load through a gateway without the queue (--max-inflight-per-slot=-1: the runner's
// first-come queue) and with it at 1 per slot (with and without a slot kept for other
// clients, --reserve-slots) and 2 per slot, interleaved. The light client streams
// lightRequests short answers one after another; the benchmark reports its wait (time
// to the first token) and its whole latency, p50 to p99 of all rounds and beside the
// same with no other load, and the replica's throughput (completion tokens per second
// of both clients: the light client's share is larger with the queue, so the heavy
// client's alone would count fairness as a loss) each way. HEAVY_TOKENS sets the heavy
// requests' length (default 64).
func BenchmarkFairQueue(b *testing.B) {
	const lightRequests, lightTokens = 16, 16
	ns := testenv.NewNamespace(b, fleet.Client)
	if err := fleet.Client.Create(b.Context(), deployment(ns, "fair", 1)); err != nil {
		b.Fatal(err)
	}
	waitReady(b, ns, "fair", 1, 3*time.Minute)
	model := ns + "/fair"
	heavyTokens := 64
	if v, err := strconv.Atoi(os.Getenv("HEAVY_TOKENS")); err == nil && v > 0 {
		heavyTokens = v
	}
	type mode struct {
		name      string
		perSlot   int
		reserve   int
		url       string
		wait, lat []time.Duration // the light client's time to first token, and to the end
		tps       []float64
		alone     []float64
	}
	modes := []*mode{{name: "fifo", perSlot: -1}, {name: "fair1-noreserve", perSlot: 1, reserve: -1}, {name: "fair1", perSlot: 1},
		{name: "fair2", perSlot: 2}}
	ask := func(c openai.Client, maxTokens int) (int64, error) {
		r, err := c.Chat.Completions.New(b.Context(), params(b, fmt.Sprintf(
			`{"model":%q,"max_tokens":%d,"temperature":0,"messages":[{"role":"user","content":"Tell a long story"}]}`,
			model, maxTokens)))
		if err != nil {
			return 0, err
		}
		return r.Usage.CompletionTokens, nil
	}
	for _, m := range modes {
		m.url, _ = queueGateway(b, m.perSlot, fairqueue.Limits{ReserveSlots: m.reserve})
		c := clientFrom(m.url, "127.0.0.3", 0)
		testenv.Eventually(b, time.Minute, 100*time.Millisecond, func() (bool, string) {
			_, err := ask(c, 1)
			return err == nil, fmt.Sprintf("%s does not serve %s yet: %v", m.url, model, err)
		})
	}
	// light sends the light client's requests through url one after another.
	light := func(url string) (wait, lat []time.Duration) {
		lc := clientFrom(url, "127.0.0.3", 0)
		for range lightRequests {
			w, l, err := streamTimes(b.Context(), lc, model, lightTokens)
			if err != nil {
				b.Fatalf("light: %v", err)
			}
			wait, lat = append(wait, w), append(lat, l)
		}
		return wait, lat
	}
	// round runs the load through url: 8 heavy workers while the light client sends
	// its requests; tokensPerSecond counts the heavy client's completion tokens and
	// the light client's.
	round := func(url string) (wait, lat []time.Duration, tokensPerSecond float64) {
		heavy := clientFrom(url, "127.0.0.2", 0)
		stop := make(chan struct{})
		var served sync.WaitGroup
		var tokens atomic.Int64
		start := time.Now()
		for range 8 {
			served.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					n, err := ask(heavy, heavyTokens)
					if err != nil {
						b.Errorf("heavy: %v", err)
						return
					}
					tokens.Add(n)
				}
			})
		}
		wait, lat = light(url)
		close(stop)
		served.Wait()
		tokens.Add(int64(lightRequests * lightTokens))
		return wait, lat, float64(tokens.Load()) / time.Since(start).Seconds()
	}
	// alone is the heavy client by itself, 8 workers × 6 requests: the queue's own cost
	// to throughput, with no other client to share with.
	alone := func(url string) float64 {
		heavy := clientFrom(url, "127.0.0.2", 0)
		var wg sync.WaitGroup
		var tokens atomic.Int64
		start := time.Now()
		for range 8 {
			wg.Go(func() {
				for range 6 {
					n, err := ask(heavy, heavyTokens)
					if err != nil {
						b.Errorf("heavy alone: %v", err)
						return
					}
					tokens.Add(n)
				}
			})
		}
		wg.Wait()
		return float64(tokens.Load()) / time.Since(start).Seconds()
	}
	// The light client with no other load, through the queue (nothing waits in it).
	var unloadedWait, unloadedLat []time.Duration
	for b.Loop() {
		w, l := light(modes[1].url)
		unloadedWait, unloadedLat = append(unloadedWait, w...), append(unloadedLat, l...)
		line := ""
		for _, m := range modes {
			w, l, r := round(m.url)
			a := alone(m.url)
			m.wait, m.lat, m.tps, m.alone = append(m.wait, w...), append(m.lat, l...), append(m.tps, r), append(m.alone, a)
			line += fmt.Sprintf("  %s: light wait p50 %v, %.0f tokens/s; alone %.0f tokens/s", m.name,
				pctl(w, 0.5).Round(100*time.Microsecond), r, a)
		}
		b.Logf("round %d (heavy %d tokens):%s", len(modes[0].tps), heavyTokens, line)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pctl(unloadedWait, 0.5)), "light-wait-p50-unloaded-ms")
	b.ReportMetric(ms(pctl(unloadedWait, 0.99)), "light-wait-p99-unloaded-ms")
	b.ReportMetric(ms(pctl(unloadedLat, 0.5)), "light-p50-unloaded-ms")
	b.ReportMetric(ms(pctl(unloadedLat, 0.99)), "light-p99-unloaded-ms")
	fifo := modes[0]
	for _, m := range modes {
		b.ReportMetric(ms(pctl(m.wait, 0.5)), "light-wait-p50-"+m.name+"-ms")
		b.ReportMetric(pctl(m.wait, 0.99).Seconds()/pctl(unloadedWait, 0.99).Seconds(), "light-wait-p99-vs-unloaded-"+m.name)
		b.ReportMetric(pctl(m.lat, 0.99).Seconds()/pctl(unloadedLat, 0.99).Seconds(), "light-p99-vs-unloaded-"+m.name)
		b.ReportMetric(pctl(m.lat, 0.5).Seconds()/pctl(unloadedLat, 0.5).Seconds(), "light-p50-vs-unloaded-"+m.name)
		if m != fifo {
			b.ReportMetric(pctl(fifo.lat, 0.5).Seconds()/pctl(m.lat, 0.5).Seconds(), "light-speedup-"+m.name)
			b.ReportMetric(median(m.tps)/median(fifo.tps), "tokens-per-s-ratio-"+m.name)
			b.ReportMetric(median(m.alone)/median(fifo.alone), "alone-tokens-per-s-ratio-"+m.name)
		}
	}
}

// median is the middle of v, sorting a copy.
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
