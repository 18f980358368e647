package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// specStreams is how many requests BenchmarkSpeculationStreams runs side by side.
const specStreams = 16

// BenchmarkSpeculationStreams measures the aggregate decode rate of 16 requests
// answered side by side, every slot busy, with speculation off and on in turn on one
// runner (issue 57: the 16-stream aggregate is to be no worse with speculation). Half
// of the requests quote a file read back (prompt lookup drafts them), half have
// nothing to copy; each asks about something else, so the slots answer differently.
// A round is the 16 answers' completion tokens over the time from the first request
// sent to the last answer; the rounds alternate off and on, and the median of their
// ratios is reported with the totals.
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench SpeculationStreams -benchtime 5x ./test/runner
func BenchmarkSpeculationStreams(b *testing.B) {
	r := startReady(b, speculationModelB(b), "--parallel", fmt.Sprint(specStreams), "--ctx", fmt.Sprint(specStreams*1024),
		"--threads", benchThreads("2"))
	bodies := make([]map[string]any, specStreams)
	for i := range bodies {
		var s string
		if i%2 == 0 {
			s = `{"model":"m","max_tokens":160,"temperature":0,"tools":[` + readTool + `],"messages":[` +
				readBack(fmt.Sprintf("Entry %d: %s", i, notes)) + `]}`
		} else {
			s = fmt.Sprintf(`{"model":"m","max_tokens":160,"temperature":0,"messages":[{"role":"user","content":"Tell me about topic %d."}]}`, i)
		}
		if err := json.Unmarshal([]byte(s), &bodies[i]); err != nil {
			b.Fatal(err)
		}
	}
	if _, _, err := streamsRound(r, bodies, runnerapi.SpeculationOff); err != nil { // warms the prompt cache
		b.Fatal(err)
	}
	var off, on roundCounts
	var offTime, onTime time.Duration
	ratios := make([]float64, 0, b.N)
	for range b.N {
		n, dOff, err := streamsRound(r, bodies, runnerapi.SpeculationOff)
		if err != nil {
			b.Fatal(err)
		}
		m, dOn, err := streamsRound(r, bodies, runnerapi.SpeculationOn)
		if err != nil {
			b.Fatal(err)
		}
		off.add(n)
		on.add(m)
		offTime, onTime = offTime+dOff, onTime+dOn
		ratios = append(ratios, (float64(m.tokens)/dOn.Seconds())/(float64(n.tokens)/dOff.Seconds()))
	}
	offRate, onRate := float64(off.tokens)/offTime.Seconds(), float64(on.tokens)/onTime.Seconds()
	b.ReportMetric(offRate, "off-agg-tok/s")
	b.ReportMetric(onRate, "on-agg-tok/s")
	b.ReportMetric(onRate/offRate, "on/off")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "median-on/off")
	if on.drafted > 0 {
		b.ReportMetric(float64(on.kept)/float64(on.drafted), "kept/drafted")
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
