// Command fleetcache is the fleet prompt cache benchmark of issue 26 (`make
// bench-fleetcache`; docs/benchmarks.md, "The fleet as one prompt cache"): a local
// fleet of 4 simulated Macs (test/support/localfleet) serves one deployment of a model
// with the real Llama 3 vocabulary, one replica per Mac, the prompt cache on with hot
// and SSD budgets smaller than the tenants' prefixes together. T tenants each share a
// system prompt of about P tokens among U users, whose short unique questions arrive
// as a seeded Poisson stream. The same workload shape (fresh prefixes for each mode)
// goes through one in-process gateway per routing mode, back to back with the hot
// tiers cleared in between: least-load, prefix-affinity, prefix-cache (routing by what
// each replica holds, without peer fetch) and prefix-cache-peer-fetch (the same, and a
// replica that misses a prefix another Mac's replica holds fetches its state when the
// gateway estimates that faster than prefilling); -modes adds prefix-cache-no-inflight
// (prefix-cache without the record of the prefixes being prefilled). It prints, per mode, TTFT p50/p90/p99, throughput, the prompt tokens
// restored (usage cached_tokens), the runners' hot and SSD tier hits (through the
// agents' /api/status), the gateway's routing decisions and peer fetches (by result,
// and the bytes moved) and how many cold answers
// arrived before their tenant's first token (-requests: every answer), then the TTFT
// p90 ratio of prefix-affinity to each prefix-cache mode.
//
// Traffic stays on this machine (the agents listen on its own address, everything
// else on loopback); every request is bounded in time, each mode in requests and
// time, the run by -timeout; the fleet and its directory are removed on exit and on
// Ctrl-C. Run it from the repository root with KUBEBUILDER_ASSETS set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/localfleet"
)

type options struct {
	macfleet, runner      string
	macs                  int
	tenants, users, words int
	rate                  float64
	maxTokens, ctxPerSlot int
	hotBytes, ssdBytes    string
	seed                  uint64
	modes, cacheKeys      string
	modeLimit, reqTimeout time.Duration
	timeout               time.Duration
	smoke, keep, requests bool
}

func main() {
	var o options
	flag.StringVar(&o.macfleet, "macfleet", "bin/macfleet", "the macfleet binary")
	flag.StringVar(&o.runner, "runner", "bin/macfleet-runner", "the macfleet-runner binary")
	flag.IntVar(&o.macs, "macs", 4, "simulated Macs, one replica on each")
	flag.IntVar(&o.tenants, "tenants", 4, "tenants (T), each with its own system prompt")
	flag.IntVar(&o.users, "users", 24, "users per tenant (U), each one request with a unique question (the tenants' first requests, which nothing can hold, are T of T × U)")
	flag.IntVar(&o.words, "words", 3750, "words of each system prompt (about 1.1 Llama 3 tokens a word: 3750 are about 4.1 k tokens)")
	flag.Float64Var(&o.rate, "rate", 0.4, "arrivals per second (Poisson)")
	flag.IntVar(&o.maxTokens, "max-tokens", 8, "tokens generated per request")
	flag.IntVar(&o.ctxPerSlot, "ctx", 8192, "context per slot (two slots a replica)")
	flag.StringVar(&o.hotBytes, "hot-bytes", "2Mi", "each Mac's hot tier budget (agent --prompt-cache-hot-bytes)")
	flag.StringVar(&o.ssdBytes, "ssd-bytes", "2Mi", "each replica's SSD quota (agent --prompt-cache-ssd-bytes)")
	flag.Uint64Var(&o.seed, "seed", 26, "seed of the prompts and arrivals")
	flag.StringVar(&o.cacheKeys, "cache-key", keyUser, "the prompt_cache_key each request carries: user (a thread id per user), tenant or none")
	flag.StringVar(&o.modes, "modes", "least-load,prefix-affinity,prefix-cache,"+modePeerFetch,
		"routing modes, in the order run (prefix-cache: without peer fetch; "+modePeerFetch+": with it; "+
			modeNoInFlight+": prefix-cache without peer fetch and without the record of the prefixes being prefilled)")
	flag.DurationVar(&o.modeLimit, "mode-limit", 250*time.Second, "latest arrival of a mode (later gaps shrink to fit)")
	flag.DurationVar(&o.reqTimeout, "request-timeout", 3*time.Minute, "each request's limit")
	flag.DurationVar(&o.timeout, "timeout", 40*time.Minute, "the whole run's limit")
	flag.BoolVar(&o.smoke, "smoke", false, "a quick check: 2 Macs, 2 tenants × 2 users, short prompts (the fleet's start dominates)")
	flag.BoolVar(&o.keep, "keep", false, "keep the fleet's directory (logs) after the run")
	flag.BoolVar(&o.requests, "requests", false, "print each answer: tenant, user, arrival, TTFT, tokens restored")
	flag.Parse()
	if o.smoke {
		o.macs, o.tenants, o.users, o.words, o.rate, o.maxTokens = 2, 2, 2, 300, 4, 2
		o.modeLimit, o.reqTimeout = 20*time.Second, time.Minute
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-fleetcache:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	modes := strings.Split(o.modes, ",")
	if o.macs < 1 || o.tenants < 1 || o.users < 1 || o.rate <= 0 || len(modes) == 0 {
		return errors.New("-macs, -tenants, -users and -rate must be positive")
	}
	if o.cacheKeys != keyNone && o.cacheKeys != keyUser && o.cacheKeys != keyTenant {
		return fmt.Errorf("-cache-key %q: want user, tenant or none", o.cacheKeys)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	dir, err := fleetDir()
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Println("fleet directory:", dir)
	}
	fmt.Printf("load before the fleet starts: %s\n", localfleet.LoadAverage())
	startCtx, startCancel := context.WithTimeout(ctx, 5*time.Minute)
	f, err := localfleet.Start(startCtx, localfleet.Options{Binary: o.macfleet, Runner: o.runner, Dir: dir,
		Nodes: macs(o.macs), Log: os.Stderr,
		AgentArgs: []string{"--prompt-cache-hot-bytes", o.hotBytes, "--prompt-cache-ssd-bytes", o.ssdBytes}})
	startCancel()
	if err != nil {
		return fmt.Errorf("starting the fleet: %w", err)
	}
	defer f.Stop()
	spec, err := writeModel(f)
	if err != nil {
		return err
	}
	fmt.Printf("T=%d tenants × U=%d users, system prompts of %d words, %.2f arrivals/s (Poisson, seed %d), prompt_cache_key: %s, "+
		"hot budget %s a Mac, SSD quota %s a replica, %d Macs\n", o.tenants, o.users, o.words, o.rate, o.seed, o.cacheKeys, o.hotBytes, o.ssdBytes, o.macs)
	fmt.Printf("model: %s (vocabulary %d, embd %d, %d layers, %d heads / %d KV heads, f16), %d slots × %d tokens a replica\n",
		spec.Name, spec.Vocab, spec.Embd, spec.Layers, spec.Heads, spec.KVHeads, 2, o.ctxPerSlot)
	if err := deploy(ctx, f, int32(o.macs), o.ctxPerSlot); err != nil {
		return err
	}
	readyCtx, readyCancel := context.WithTimeout(ctx, 5*time.Minute)
	err = waitReplicas(readyCtx, f, o.macs)
	readyCancel()
	if err != nil {
		return err
	}
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	var rows []summary
	for i, mode := range modes {
		row, err := measureMode(ctx, gctx, f, o, mode, o.seed+uint64(i)*1000)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		rows = append(rows, row)
	}
	fmt.Printf("load after the run: %s\n\n", localfleet.LoadAverage())
	fmt.Print(table(rows))
	printRatio(rows)
	failed := 0
	for _, r := range rows {
		failed += r.Failed
	}
	if failed > 0 {
		return fmt.Errorf("%d requests failed (above)", failed)
	}
	return nil
}

// measureMode runs the workload through a gateway of one routing mode, on prefixes of
// its own (seed) and the run's arrivals (o.seed), after clearing the hot tiers.
func measureMode(ctx, gctx context.Context, f *localfleet.Fleet, o options, mode string, seed uint64) (summary, error) {
	g, err := startGateway(gctx, f, mode)
	if err != nil {
		return summary{}, err
	}
	model := namespace + "/" + deployName
	if err := waitServes(ctx, g.url, model); err != nil {
		return summary{}, err
	}
	if err := clearHot(ctx, f); err != nil {
		return summary{}, err
	}
	before, err := counters(ctx, f, false)
	if err != nil {
		return summary{}, err
	}
	routedBefore, err := g.routed()
	if err != nil {
		return summary{}, err
	}
	// The same arrivals in every mode (o.seed); the prefixes are the mode's own (seed).
	w := workload{Requests: schedule(o.seed, o.tenants, o.users, o.rate, o.modeLimit)}
	for t := range o.tenants {
		w.Systems = append(w.Systems, systemPrompt(seed, t, o.words))
	}
	fmt.Printf("%s: %d requests, load %s\n", mode, len(w.Requests), localfleet.LoadAverage())
	outs := runLoad(ctx, g.url, model, o.cacheKeys, w, o.maxTokens, o.reqTimeout)
	after, err := counters(ctx, f, true)
	if err != nil {
		return summary{}, err
	}
	routed, err := g.routed()
	if err != nil {
		return summary{}, err
	}
	for k := range routed {
		routed[k] -= routedBefore[k]
	}
	for _, o := range outs {
		if o.Err != "" {
			fmt.Printf("  tenant %d user %d: %s\n", o.Tenant, o.User, o.Err)
		}
	}
	s := summarize(mode, outs, after.sub(before), routed)
	fmt.Printf("%s done: TTFT p90 %s, %d of %d prompt tokens restored, load %s\n", mode, secs(s.P90), s.Cached, s.Prompt, localfleet.LoadAverage())
	c := splitCold(outs, s.P90)
	fmt.Printf("%s cold answers (restored less than half the prompt): %d, %d of them arrived before their tenant's first token anywhere, %d after; "+
		"%d of the %d answers at or above the p90 are such early ones\n", mode, c.Cold, c.Early, c.Late, c.InTail, c.Tail)
	if o.requests {
		fmt.Print(requestLines(mode, outs))
	}
	return s, ctx.Err()
}

// waitServes waits until the gateway answers a one-token request for model.
func waitServes(ctx context.Context, url, model string) error {
	var last string
	return localfleet.Poll(ctx, 2*time.Minute, func() (bool, error) {
		var o outcome
		send(ctx, defaultClient, url, chatBody(model, "Ready?", "", 0, 0, 1), &o, time.Now())
		last = o.Err
		return o.Err == "", nil
	}, func() string { return "the gateway to serve " + model + ": " + last })
}

// printRatio prints prefix-affinity's TTFT p90 over prefix-cache's, with and
// without the in-flight record.
func printRatio(rows []summary) {
	var aff *summary
	for i := range rows {
		if gateway.Routing(rows[i].Mode) == gateway.RoutingPrefixAffinity {
			aff = &rows[i]
		}
	}
	if aff == nil {
		return
	}
	for _, r := range rows {
		if gatewayMode(r.Mode).Routing == gateway.RoutingPrefixCache {
			fmt.Printf("\nTTFT p90, prefix-affinity / %s: %.2f× (target ≥ 5×); p50 %.2f×", r.Mode, ratio(aff.P90, r.P90), ratio(aff.P50, r.P50))
		}
	}
	fmt.Println()
}
