package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/localfleet"
)

// BenchmarkStreamOverhead measures what the gateway adds to an uninterrupted stream:
// the same 16-token streamed chat of a trivial model, interleaved, straight to the
// agent that serves it and through the gateway, which reads every event to be able to
// continue the stream elsewhere, and with $MACFLEET_BENCH_BASELINE through the
// gateway of an earlier build beside it. It reports p50/p99 of the time to the first
// content event and to the end of the stream each way, and their ratios.
//
//	MACFLEET_BENCH_BASELINE=$(hack/build-macfleet-at.sh COMMIT) \
//	  go test ./test/e2e -run '^$' -bench StreamOverhead -benchtime 200x
func BenchmarkStreamOverhead(b *testing.B) {
	addr, hc := benchDeployment(b, 2, 4)
	body := []byte(`{"model":"bench","max_tokens":16,"temperature":0,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	// send streams one answer and returns the times to its first content event and to
	// its end ([DONE]).
	send := func(url string) (first, whole time.Duration) {
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			line := sc.Text()
			if first == 0 && strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
				first = time.Since(start)
			}
			if line == "data: [DONE]" {
				done = true
			}
		}
		if err := sc.Err(); err != nil || !done || first == 0 {
			b.Fatalf("%s: the stream ended without content or [DONE] (%v)", url, err)
		}
		return first, time.Since(start)
	}
	// The ways in: straight to the agent, through the fleet's gateway, and, with
	// $MACFLEET_BENCH_BASELINE (a macfleet binary, e.g. hack/build-macfleet-at.sh of an
	// earlier commit), through a gateway of that binary beside it.
	ways := []struct {
		name, url    string
		first, whole []time.Duration
	}{{name: "direct", url: localfleet.AgentURL(addr)}, {name: "gateway", url: fleet.GatewayURL}}
	if bin := os.Getenv("MACFLEET_BENCH_BASELINE"); bin != "" {
		url, err := fleet.AddGateway(b.Context(), bin)
		if err != nil {
			b.Fatalf("starting the baseline's gateway (%s): %v", bin, err)
		}
		ways = append(ways, struct {
			name, url    string
			first, whole []time.Duration
		}{name: "baseline", url: url})
	}
	for i := range ways {
		ways[i].url += "/v1/chat/completions"
		for range 10 {
			send(ways[i].url)
		}
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		for j := range ways {
			w := &ways[(i+j)%len(ways)] // the first of each round rotates
			f, all := send(w.url)
			w.first, w.whole = append(w.first, f), append(w.whole, all)
		}
		i++
	}
	b.StopTimer()
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	direct := ways[0]
	fmt.Printf("stream overhead, 16-token streams of the tiny model, %d interleaved rounds; load %s\n", len(direct.whole), localfleet.LoadAverage())
	for _, w := range ways {
		b.ReportMetric(ms(pctl(w.first, 0.5)), w.name+"-first-p50-ms")
		b.ReportMetric(ms(pctl(w.whole, 0.5)), w.name+"-whole-p50-ms")
		fmt.Printf("  %-8s first event p50 %6.2f ms p99 %6.2f ms; whole stream p50 %6.2f ms p99 %6.2f ms; whole p50 %.3f× direct's\n", w.name,
			ms(pctl(w.first, 0.5)), ms(pctl(w.first, 0.99)), ms(pctl(w.whole, 0.5)), ms(pctl(w.whole, 0.99)),
			float64(pctl(w.whole, 0.5))/float64(pctl(direct.whole, 0.5)))
	}
	if len(ways) == 3 {
		b.ReportMetric(float64(pctl(ways[1].whole, 0.5))/float64(pctl(ways[2].whole, 0.5)), "gateway/baseline-whole-p50")
		fmt.Printf("  gateway ÷ baseline: first event p50 %.3f×, whole stream p50 %.3f×\n",
			float64(pctl(ways[1].first, 0.5))/float64(pctl(ways[2].first, 0.5)), float64(pctl(ways[1].whole, 0.5))/float64(pctl(ways[2].whole, 0.5)))
	}
}
