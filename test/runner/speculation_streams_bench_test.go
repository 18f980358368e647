package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// specStreams is how many requests BenchmarkSpeculationStreams runs side by side.
const specStreams = 16

// BenchmarkSpeculationStreams measures the aggregate decode rate of 16 requests
// answered side by side, every slot busy, with speculation off and on in turn on one
// runner, and left to the runner (no header), in turn (issue 57: the 16-stream
// aggregate is to be no worse with speculation), in two mixes, each on a runner of
// its own: half-copy, where half of the requests quote a file read back (prompt
// lookup drafts them: copyFile) and half have nothing to copy, and nothing-to-copy,
// all 16 of the second kind, where every draft is a cost. Each request asks about
// something else, so the slots answer differently. A round is the 16 answers'
// completion tokens over the time from the first request sent to the last answer;
// the rounds alternate off, on and auto, each round in another of their six orders, after
// a round of each not counted (a fresh runner's first: reported alone), and the
// medians of on's and auto's ratios to off's are reported with the totals.
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench SpeculationStreams -benchtime 5x ./test/runner
func BenchmarkSpeculationStreams(b *testing.B) {
	model := speculationModelB(b)
	for _, mix := range []struct {
		name string
		copy bool
	}{{"half-copy", true}, {"nothing-to-copy", false}} {
		b.Run(mix.name, func(b *testing.B) { benchStreams(b, model, mix.copy) })
	}
}

// benchStreams is one mix of BenchmarkSpeculationStreams: half of the requests copy
// where halfCopy, none otherwise.
func benchStreams(b *testing.B, model string, halfCopy bool) {
	r := startReady(b, model, "--parallel", fmt.Sprint(specStreams), "--ctx", fmt.Sprint(specStreams*1024),
		"--threads", benchThreads("2"))
	bodies := make([]map[string]any, specStreams)
	for i := range bodies {
		var s string
		if halfCopy && i%2 == 0 {
			s = `{"model":"m","max_tokens":160,"temperature":0,"tools":[` + readTool + `],"messages":[` +
				readBack(copyFile(i/2)) + `]}`
		} else {
			s = fmt.Sprintf(`{"model":"m","max_tokens":160,"temperature":0,"messages":[{"role":"user","content":"Tell me about topic %d."}]}`, i)
		}
		if err := json.Unmarshal([]byte(s), &bodies[i]); err != nil {
			b.Fatal(err)
		}
	}
	// Not counted: a round with speculation off, which warms the prompt cache, then a
	// round of each mode: a fresh runner's first steps of each (the gate learning its
	// step times, a card recording each batch shape's graph) are a cost of that
	// mode's first round, which off's warm round alone kept out of the rounds before.
	// What that round cost auto is reported alone (first-auto/off).
	var first [3]float64
	for i, mode := range append([]string{runnerapi.SpeculationOff}, specModes...) {
		c, d, err := streamsRound(r, bodies, mode)
		if err != nil {
			b.Fatal(err)
		}
		if i > 0 {
			first[i-1] = float64(c.tokens) / d.Seconds()
		}
	}
	var sums [3]roundCounts
	var took [3]time.Duration
	ratios := [3][]float64{}
	var autoDrafted []string // what the gate let through, by round: drafted/kept
	var runs []string        // each round's modes in the order run, with their rates
	for n := range b.N {
		var rates [3]float64
		// Each round runs the modes in another of their six orders: a mode that ran
		// after another may find its state (a card's graphs of the draft shapes, the
		// batch's cells), and no mode always does.
		var run []string
		for _, i := range modeOrders[n%len(modeOrders)] {
			mode := specModes[i]
			c, d, err := streamsRound(r, bodies, mode)
			if err != nil {
				b.Fatal(err)
			}
			sums[i].add(c)
			took[i] += d
			rates[i] = float64(c.tokens) / d.Seconds()
			run = append(run, fmt.Sprintf("%s %.0f", specModeNames[i], rates[i]))
			if mode == runnerapi.SpeculationAuto {
				autoDrafted = append(autoDrafted, fmt.Sprintf("%d/%d", c.drafted, c.kept))
			}
		}
		runs = append(runs, strings.Join(run, ", "))
		for i := 1; i < 3; i++ {
			ratios[i] = append(ratios[i], rates[i]/rates[0])
		}
	}
	var rates [3]float64
	for i := range rates {
		rates[i] = float64(sums[i].tokens) / took[i].Seconds()
	}
	b.Logf("auto/off by round, in order: %.2f; auto's drafted/kept tokens: %s; the rounds, agg-tok/s in the order run: %s",
		ratios[2], strings.Join(autoDrafted, " "), strings.Join(runs, "; "))
	reportModes(b, rates, ratios, "agg-tok/s")
	b.ReportMetric(first[2]/first[0], "first-auto/off")
	if on := sums[1]; on.drafted > 0 {
		b.ReportMetric(float64(on.kept)/float64(on.drafted), "kept/drafted")
	}
	if auto := sums[2]; auto.tokens > 0 {
		// What the gate let through: drafted tokens a token of the answers, and their
		// share kept.
		b.ReportMetric(float64(auto.drafted)/float64(auto.tokens), "auto-drafted/tok")
		if auto.drafted > 0 {
			b.ReportMetric(float64(auto.kept)/float64(auto.drafted), "auto-kept/drafted")
		}
	}
}

// copyFile is the i-th copy-heavy stream's file: unseenFile's clauses in another
// order (rotated by i, reversed from the fifth on), which the trained model quotes
// as it does unseenFile, each stream its own. (The file before, one sentence of other
// words behind "Entry i:", the model quoted with a slip in most words: 16 % of the
// drafted tokens kept, where a stream of the copy-heavy turn keeps three in four.)
func copyFile(i int) string {
	clauses := regexp.MustCompile(`[^.;]+[.;]`).FindAllString(unseenFile, -1)
	for j := range clauses {
		clauses[j] = strings.TrimSpace(clauses[j])
	}
	k := i % len(clauses)
	c := append(slices.Clone(clauses[k:]), clauses[:k]...)
	if i/len(clauses)%2 == 1 {
		slices.Reverse(c)
	}
	return strings.Join(c, " ")
}

// modeOrders are the six orders of specModes' indices, one a round.
var modeOrders = [][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {2, 1, 0}, {1, 0, 2}}

// specModes are the speculation modes the benchmarks compare, off first (the
// baseline), and their names in the metrics.
var specModes, specModeNames = []string{runnerapi.SpeculationOff, runnerapi.SpeculationOn, runnerapi.SpeculationAuto},
	[3]string{"off", "on", "auto"}

// reportModes reports each mode's rate (in unit), on's and auto's ratios to off's, and
// the medians of their rounds' ratios (ratios[1] and [2]; robust to a busy
// machine's outliers).
func reportModes(b *testing.B, rates [3]float64, ratios [3][]float64, unit string) {
	for i, name := range specModeNames {
		b.ReportMetric(rates[i], name+"-"+unit)
		if i == 0 {
			continue
		}
		b.ReportMetric(rates[i]/rates[0], name+"/off")
		slices.Sort(ratios[i])
		b.ReportMetric(ratios[i][len(ratios[i])/2], "median-"+name+"/off")
	}
}

// roundCounts are completion tokens and, of the drafted tokens, those kept and all.
type roundCounts struct{ tokens, kept, drafted int }

func (c *roundCounts) add(o roundCounts) {
	c.tokens, c.kept, c.drafted = c.tokens+o.tokens, c.kept+o.kept, c.drafted+o.drafted
}

// streamsRound posts every body at once with speculation spec and waits for all the
// answers: their counts and the round's wall time, or the first error.
func streamsRound(r *runner, bodies []map[string]any, spec string) (roundCounts, time.Duration, error) {
	var mu sync.Mutex
	var sum roundCounts
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	for _, body := range bodies {
		wg.Go(func() {
			u, err := chatUsage(r, body, spec)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			one := roundCounts{tokens: u.CompletionTokens}
			if d := u.CompletionTokensDetails; d != nil {
				one.kept, one.drafted = d.AcceptedPredictionTokens, d.AcceptedPredictionTokens+d.RejectedPredictionTokens
			}
			sum.add(one)
		})
	}
	wg.Wait()
	return sum, time.Since(start), errors.Join(errs...)
}

// chatUsage posts one chat request with speculation spec and returns its usage; it
// returns errors rather than failing the benchmark, for use from goroutines.
func chatUsage(r *runner, body map[string]any, spec string) (runnerapi.Usage, error) {
	buf, err := json.Marshal(body)
	if err != nil {
		return runnerapi.Usage{}, err
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(buf))
	if err != nil {
		return runnerapi.Usage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(runnerapi.HeaderSpeculation, spec)
	resp, err := r.client.Do(req)
	if err != nil {
		return runnerapi.Usage{}, err
	}
	defer resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK || c.Usage == nil {
		return runnerapi.Usage{}, fmt.Errorf("speculation %s: status %d, %v", spec, resp.StatusCode, err)
	}
	return *c.Usage, nil
}
