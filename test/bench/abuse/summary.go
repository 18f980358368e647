package main

import (
	"fmt"
	"strings"
	"time"
)

// The targets.
const (
	budgetTarget  = 1.10                   // tokens served in the minute over the budget
	idleTarget    = 2.0                    // p99 beside the idle or stalled connections over alone
	hotPathTarget = 100 * time.Microsecond // p50 under test minus the baseline's
)

// summary is the run's figures against the targets, for docs/benchmarks.md.
func (r *report) summary(o options) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("== issue 42: the defences measured (load before %s; after %s; open files: %s)", r.LoadBefore, r.LoadAfter, r.Files)
	for _, br := range r.budgets(o) {
		p("budget, %d gateway(s)%s: %d streams of n=%d, max_tokens %d (ask %d) against %d tokens a minute: %d served %v, %d refused, %d retries; "+
			"%d tokens served = %.0f %% of the budget (ledger %d; target ≤ %.0f %%: %s)%s",
			br.Gateways, br.laterText(), br.Streams, o.choices, o.maxTokens, br.Ask, o.budget, br.served(), br.Served, br.Refused, br.Retries,
			br.Tokens, percent(br.Tokens, o.budget), br.Ledger, budgetTarget*100, verdict(float64(br.Tokens) <= budgetTarget*float64(o.budget)),
			crossed(br.Crossed))
	}
	for _, ph := range r.idles(o) {
		i := ph.i
		p("idle connections on %s: another client's p50/p99 alone %s / %s, alone again after the attacks %s / %s",
			ph.name, ms(i.Alone.quantile(0.5)), ms(i.Alone.quantile(0.99)), ms(i.AloneAfter.quantile(0.5)), ms(i.AloneAfter.quantile(0.99)))
		for _, at := range i.Attacks {
			rp99 := ratio(at.Attacked.quantile(0.99), i.Alone.quantile(0.99))
			p("  beside %d %s from %d address(es) (refused ones dial again: %s): %s / %s, p99 %.2f× (target ≤ %.0f×: %s), "+
				"%d of the client's %d requests failed%s; the attacker held %d (at most %d) after %d attempts, %d refused, "+
				"%d closed by the server, %d dial errors, %d other failures; %s",
				at.Conns, at.Kind, at.Sources, redialText(at.Redial), ms(at.Attacked.quantile(0.5)), ms(at.Attacked.quantile(0.99)), rp99, idleTarget,
				verdict(rp99 <= idleTarget), at.Attacked.Failed, o.legit, lastFail(at.Attacked), at.Held, at.MaxHeld, at.Attempts, at.Refused,
				at.ClosedByGateway, at.DialErrors, at.Failed, at.CPU)
		}
	}
	for _, f := range r.bearers(o) {
		p("bearers, %d %s from one source in %v: %d TokenReviews, the per-source limit allows %d (target ≤: %s); answers %s",
			f.Sent, f.Kind, f.Elapsed.Round(time.Millisecond), f.Reviews, f.Allowed, verdict(f.Reviews <= f.Allowed), statusList(f.Status))
	}
	if o.runs("bearers") {
		p("bearers: a valid ServiceAccount token from another address after the floods: %d", r.ValidToken)
	}
	if h := r.Hot; o.runs("hot") {
		p("hot path (one-token chat completion, %d interleaved pairs; baseline %s): p50 %s with the defences, %s baseline: %+.0f µs, %.2f× "+
			"(target ≤ +%d µs: %s)", h.Pairs, r.BaselineLabel, ms(h.Test.quantile(0.5)), ms(h.Baseline.quantile(0.5)),
			float64(h.delta())/float64(time.Microsecond), ratio(h.Test.quantile(0.5), h.Baseline.quantile(0.5)),
			hotPathTarget/time.Microsecond, verdict(h.delta() <= hotPathTarget))
	}
	if ps := r.problems(o); len(ps) > 0 {
		p("the harness saw problems (the figures above are not to be trusted):\n  %s", strings.Join(ps, "\n  "))
	}
	return b.String()
}

// problems are what makes a run's figures unusable, whatever they are: failed
// requests, a phase that served nothing or ran into the next minute, answers of the
// wrong kind.
func (r *report) problems(o options) []string {
	var ps []string
	add := func(cond bool, format string, args ...any) {
		if cond {
			ps = append(ps, fmt.Sprintf(format, args...))
		}
	}
	for _, br := range r.budgets(o) {
		add(br.served() == 0, "budget over %d gateway(s): no stream served", br.Gateways)
		add(br.Failed > 0, "budget over %d gateway(s): %d streams failed, the last: %s", br.Gateways, br.Failed, br.LastFail)
		add(br.Crossed, "budget over %d gateway(s): the phase ran into the next minute", br.Gateways)
		add(br.served()+br.Refused+br.Failed != br.Streams, "budget over %d gateway(s): %d served, %d refused and %d failed of %d streams",
			br.Gateways, br.served(), br.Refused, br.Failed, br.Streams)
	}
	lats := map[string]latencies{}
	if o.runs("hot") {
		lats["hot path under test"], lats["hot path baseline"] = r.Hot.Test, r.Hot.Baseline
	}
	for _, ph := range r.idles(o) {
		name, i := ph.short, ph.i
		lats["idle alone ("+name+")"], lats["idle alone after ("+name+")"] = i.Alone, i.AloneAfter
		for _, at := range i.Attacks {
			what := fmt.Sprintf("%s: %d %s from %d address(es), refused ones dial again: %s", name, at.Conns, at.Kind, at.Sources, redialText(at.Redial))
			if ph.short != "serve" { // serve's client of a new connection a request shares the flood's address: its failures are a figure
				lats["idle beside an attack ("+what+")"] = at.Attacked
			}
			add(at.Attempts < int64(at.Conns), "idle (%s): the attacker tried %d connections of %d", what, at.Attempts, at.Conns)
			add(at.MaxHeld == 0, "idle (%s): the attacker held no connection (the last failure: %s)", what, at.LastAttackerFail)
		}
		add(len(i.Attacks) != len(idleAttacks(o)), "idle (%s): %d attacks of %d", name, len(i.Attacks), len(idleAttacks(o)))
	}
	for name, l := range lats {
		add(l.Failed > 0 || len(l.D) == 0, "%s: %d requests failed, the last: %s", name, l.Failed, l.LastFail)
	}
	for _, f := range r.bearers(o) {
		add(f.Unexpected != "", "bearers, %s: an answer neither 401 nor 429 token_review_limited: %s", f.Kind, f.Unexpected)
	}
	add(o.runs("bearers") && r.ValidToken != 200, "bearers: a valid ServiceAccount token was answered %d", r.ValidToken)
	return ps
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

func crossed(c bool) string {
	if c {
		return " (RAN INTO THE NEXT MINUTE)"
	}
	return ""
}

// budgets are the budget phase's results, none when it did not run.
func (r *report) budgets(o options) []budgetResult {
	if !o.runs("budget") {
		return nil
	}
	return []budgetResult{r.One, r.Two, r.Later}
}

// namedIdle is an idle phase's result and its names, long and short.
type namedIdle struct {
	name, short string
	i           idleResult
}

// idles are the idle phases' results that ran: on the gateway, on serve.
func (r *report) idles(o options) []namedIdle {
	var ns []namedIdle
	if o.runs("idle") {
		ns = append(ns, namedIdle{"the gateway (the other client at 127.0.0.2, a new connection a request)", "gateway", r.Idle})
	}
	if o.runs("serve") {
		ns = append(ns, namedIdle{"macfleet serve (the other client at 127.0.0.1 too, a new connection a request)", "serve", r.Serve},
			namedIdle{"macfleet serve, the other client (127.0.0.1) keeping its connection alive", "serve, kept alive", r.ServeKept})
	}
	return ns
}

// bearers are the bearer phase's results, none when it did not run.
func (r *report) bearers(o options) []bearerResult {
	if !o.runs("bearers") {
		return nil
	}
	return []bearerResult{r.Random, r.Forged}
}

// lastFail is " (the last: …)" of l's last failure, if any.
func lastFail(l latencies) string {
	if l.Failed == 0 {
		return ""
	}
	if len(l.LastFail) > 120 {
		return " (the last: " + l.LastFail[:120] + "…)"
	}
	return " (the last: " + l.LastFail + ")"
}
