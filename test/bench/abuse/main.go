// Command abuse measures the defences of issue 42 on the local fleet (`make
// bench-abuse`; docs/benchmarks.md, "Abuse: budgets, connections and tokens under
// attack"), with real components: kube-apiserver and etcd, the manager, an agent
// running a real runner, and two gateway processes sharing them (--tenant-keys).
//
//  1. Budget: S concurrent streams of n choices (default 50 of n=4) from one key
//     against its TokenBudget of B tokens a minute (default 200), once all through one
//     gateway, once split over the two, and once split with the second gateway's
//     streams a second after the first's (past the 200 ms in which a replica
//     publishes its reservations): the tokens served in the minute (the streams'
//     usage, and the gateways' TokenUsage records) against B.
//  2. Idle connections: a client at 127.0.0.2 sends R sequential one-token chat
//     completions (default 200), each on a new connection, alone, then while one
//     source, 127.0.0.1, opens C idle keep-alive connections to the same gateway
//     (default 5,000, each after one GET /healthz) and keeps those it gets (dialling
//     again a second after the gateway closes one), then while it also dials each
//     refused one again after -redial (a flood of new connections), then alone
//     again: p50 and p99 of each and the p99 ratios to alone.
//     Then the same beside C stalled request bodies from 127.0.0.1 (a chat
//     completion's headers and one byte of its body), and beside -spread idle
//     connections from -spread-sources addresses (default 1,000 from 100,
//     127.0.0.10 on). Then all of it again on `macfleet serve` with the same model,
//     the other client at 127.0.0.1 too (every local client's address): once with a
//     new connection a request, once keeping its connection alive (as the SDKs do).
//     -only runs some of the phases.
//  3. Bearers: T random JWT-shaped bearers (default 10,000) from one source, once of
//     random bytes and once forged (claims for the fleet's audience and issuer, a
//     random signature): the TokenReviews the API server answered by its own count
//     against the per-source rate limit's allowance over the elapsed time; then a
//     valid ServiceAccount token from another address.
//  4. Hot path: P pairs of one-token chat completions (default 300), interleaved,
//     through the fleet's gateway and through a gateway of -baseline (an earlier
//     build; `make bench-abuse` builds the commit before the defences) started beside
//     it on the same fleet: p50 of each, the difference and the ratio.
//
// Every request is bounded in time, each phase in requests, the run by -timeout;
// traffic stays on loopback (127.0.0.0/24) and this machine's address; the
// fleet and its directory are removed on exit and on Ctrl-C. Run it from the
// repository root with KUBEBUILDER_ASSETS set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/test/support/localfleet"
)

type options struct {
	macfleet, runner, baseline string
	// Budget phase.
	streams, choices, maxTokens int
	budget                      int64
	// Idle connections phase.
	idleConns, legit int
	// spreadConns idle connections from spreadSources addresses: the spread attack.
	spreadConns, spreadSources int
	redial                     time.Duration
	// Bearers phase.
	bearers, bearerWorkers int
	// Hot path phase.
	pairs int

	// only names the phases to run (budget, idle, serve, bearers, hot); empty: all.
	only string

	timeout     time.Duration
	smoke, keep bool
	out         io.Writer
}

// runs says whether phase is one the run measures (-only).
func (o options) runs(phase string) bool {
	return o.only == "" || slices.Contains(strings.Split(o.only, ","), phase)
}

func main() {
	o := options{out: os.Stdout}
	flag.StringVar(&o.macfleet, "macfleet", "bin/macfleet", "the macfleet binary under test")
	flag.StringVar(&o.runner, "runner", "bin/macfleet-runner", "the macfleet-runner binary")
	flag.StringVar(&o.baseline, "baseline", "", "a macfleet binary to compare the gateway's hot path with (default: -macfleet itself)")
	flag.IntVar(&o.streams, "streams", 50, "concurrent streams against the budget")
	flag.IntVar(&o.choices, "n", 4, "choices (n) of each stream")
	flag.IntVar(&o.maxTokens, "max-tokens", 25, "max_tokens of each stream (its ask is its body's bytes / 2 + 1 + max_tokens × n)")
	flag.Int64Var(&o.budget, "budget", 200, "the key's TokenBudget, tokens a minute")
	flag.IntVar(&o.idleConns, "idle", 5000, "idle connections one source tries to hold")
	flag.IntVar(&o.spreadConns, "spread", 1000, "idle connections of the spread attack, from -spread-sources addresses (127.0.0.10 on)")
	flag.IntVar(&o.spreadSources, "spread-sources", 100, "addresses of the spread attack")
	flag.IntVar(&o.legit, "requests", 200, "sequential requests of the other client, alone and beside the idle connections")
	flag.DurationVar(&o.redial, "redial", time.Second, "the second attack: how long a refused slot waits to dial again (the first attack's never do)")
	flag.IntVar(&o.bearers, "bearers", 10000, "random bearers of each kind from one source")
	flag.IntVar(&o.bearerWorkers, "bearer-workers", 20, "concurrent senders of the bearers")
	flag.IntVar(&o.pairs, "pairs", 300, "interleaved pairs of requests through the gateway under test and the baseline's")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "the whole run's limit")
	flag.BoolVar(&o.smoke, "smoke", false, "a quick check of the harness (a few streams, 300 connections, 200 bearers, 20 pairs): not the figures")
	flag.StringVar(&o.only, "only", "", "the phases to run, comma-separated (budget, idle, serve, bearers, hot); empty: all")
	flag.BoolVar(&o.keep, "keep", false, "keep the fleet's directory (logs) after the run")
	flag.Parse()
	if o.smoke {
		o = o.smokeSized()
	}
	if _, err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-abuse:", err)
		os.Exit(1)
	}
}

// smokeSized is o cut to a quick check: enough of each attack to pass each cap once.
func (o options) smokeSized() options {
	o.streams, o.idleConns, o.legit, o.bearers, o.pairs = 6, 300, 20, 200, 20
	o.spreadConns, o.spreadSources = 100, 10
	return o
}

// report is what a run measured.
type report struct {
	Files    fileLimit
	One, Two budgetResult
	Later    budgetResult
	Idle     idleResult
	Serve    idleResult
	// ServeKept is serve's phase again with a client that keeps its connection
	// alive, as the SDKs do.
	ServeKept     idleResult
	Random        bearerResult
	Forged        bearerResult
	ValidToken    int
	Hot           hotResult
	LoadBefore    string
	LoadAfter     string
	BaselineLabel string
}

func run(o options) (*report, error) {
	if o.streams < 1 || o.choices < 1 || o.maxTokens < 1 || o.budget < 1 || o.idleConns < 1 || o.legit < 1 ||
		o.spreadConns < 1 || o.spreadSources < 1 || o.spreadSources > 240 ||
		o.bearers < 1 || o.bearerWorkers < 1 || o.pairs < 1 {
		return nil, errors.New("-streams, -n, -max-tokens, -budget, -idle, -spread, -spread-sources (at most 240), -requests, -bearers, " +
			"-bearer-workers and -pairs must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	r := &report{LoadBefore: localfleet.LoadAverage(), BaselineLabel: o.baseline}
	var err error
	// Both ends of every connection live on this machine, the gateway's in its own
	// process, which inherits the limit raised here.
	if r.Files, err = raiseFileLimit(uint64(o.idleConns) + 4096); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.out, "load before the fleet starts: %s; open files: %s\n", r.LoadBefore, r.Files)
	fl, err := startFleet(ctx, o)
	if err != nil {
		return nil, err
	}
	defer fl.stop()
	if err := phases(ctx, o, fl, r); err != nil {
		return r, err
	}
	r.LoadAfter = localfleet.LoadAverage()
	fmt.Fprintf(o.out, "load after the run: %s\n\n", r.LoadAfter)
	fmt.Fprint(o.out, r.summary(o))
	if ps := r.problems(o); len(ps) > 0 {
		return r, fmt.Errorf("%d problems (above)", len(ps))
	}
	return r, nil
}

// phases runs the measurements of o.only in order on fl.
func phases(ctx context.Context, o options, fl *benchFleet, r *report) error {
	var err error
	if o.runs("budget") {
		if r.One, err = budgetPhase(ctx, o, fl, keyOne, fl.urls[:1], 0); err != nil {
			return fmt.Errorf("budget, one gateway: %w", err)
		}
		if r.Two, err = budgetPhase(ctx, o, fl, keyTwo, fl.urls, 0); err != nil {
			return fmt.Errorf("budget, two gateways: %w", err)
		}
		if r.Later, err = budgetPhase(ctx, o, fl, keyLater, fl.urls, laterBy); err != nil {
			return fmt.Errorf("budget, two gateways, the second later: %w", err)
		}
	}
	if o.runs("idle") {
		if r.Idle, err = idlePhase(ctx, o, fl); err != nil {
			return fmt.Errorf("idle connections: %w", err)
		}
	}
	if o.runs("serve") {
		if r.Serve, r.ServeKept, err = servePhase(ctx, o, fl); err != nil {
			return fmt.Errorf("idle connections on serve: %w", err)
		}
	}
	if o.runs("bearers") {
		if r.Random, r.Forged, r.ValidToken, err = bearerPhase(ctx, o, fl); err != nil {
			return fmt.Errorf("bearers: %w", err)
		}
	}
	if !o.runs("hot") {
		return nil
	}
	base := o.baseline
	if base == "" {
		base, r.BaselineLabel = o.macfleet, "the binary under test itself (no -baseline)"
	}
	if r.Hot, err = hotPhase(ctx, o, fl, base); err != nil {
		return fmt.Errorf("hot path: %w", err)
	}
	return nil
}
