package engine

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// genTokens is the length of every measured generation: greedy sampling on the
// synthesized models runs to max_tokens (checked on every stream's usage).
const genTokens = 128

// prompt is the user message of every measured generation.
const prompt = "Hello"

// BenchmarkAgentVsDirect compares the agent's path (client → macfleet serve → runner
// socket) with talking to the same runner process directly on its socket, on the mid
// model: streamed greedy chat completions, direct and agent requests interleaved (the
// order alternating every pair) after a warm-up, so machine noise hits both alike —
// 10 pairs of 128 tokens for the decode rate, and those plus 40 pairs of 4 tokens for
// the time to first token (one decode step varies by milliseconds; more pairs narrow
// the median). Metrics:
//
//	direct-tok/s, agent-tok/s   median decode rate (tokens after the first / time from first text to finish)
//	tok/s-ratio                 agent / direct (target ≥ 0.97)
//	direct-ttft-ms, agent-ttft-ms  median time to the first text chunk
//	added-ttft-ms               median over the pairs of agent TTFT − direct TTFT (target ≤ 2 ms)
//	tokenize-ms                 median POST /tokenize of the same chat on the runner: the round
//	                            trip the agent's prefill guard makes before proxying
//	other-cpus                  CPUs used by other processes meanwhile (every benchmark; Linux)
func BenchmarkAgentVsDirect(b *testing.B) {
	const (
		pairs      = 10
		shortPairs = 40
		shortLen   = 4
	)
	a := startAgent(b, served{name: modelMid, ctx: 1024})
	direct := a.direct(modelMid)
	direct.mustChat(b, modelMid, prompt, genTokens, nil)
	a.mustChat(b, modelMid, prompt, genTokens, nil)

	var dRate, aRate []float64
	var dTTFT, aTTFT, added, tok []time.Duration
	cpu := startCPU(a.cmd.Process.Pid)
	for b.Loop() {
		for i := range pairs {
			var d, g stream
			if i%2 == 0 {
				d = direct.mustChat(b, modelMid, prompt, genTokens, nil)
				g = a.mustChat(b, modelMid, prompt, genTokens, nil)
			} else {
				g = a.mustChat(b, modelMid, prompt, genTokens, nil)
				d = direct.mustChat(b, modelMid, prompt, genTokens, nil)
			}
			dRate, aRate = append(dRate, d.DecodeRate()), append(aRate, g.DecodeRate())
			dTTFT, aTTFT = append(dTTFT, d.TTFT), append(aTTFT, g.TTFT)
			added = append(added, g.TTFT-d.TTFT)
			tok = append(tok, direct.tokenize(b, prompt))
		}
		for i := range shortPairs {
			var d, g stream
			if i%2 == 0 {
				d = direct.mustChat(b, modelMid, prompt, shortLen, nil)
				g = a.mustChat(b, modelMid, prompt, shortLen, nil)
			} else {
				g = a.mustChat(b, modelMid, prompt, shortLen, nil)
				d = direct.mustChat(b, modelMid, prompt, shortLen, nil)
			}
			dTTFT, aTTFT = append(dTTFT, d.TTFT), append(aTTFT, g.TTFT)
			added = append(added, g.TTFT-d.TTFT)
		}
	}

	ratio := median(aRate) / median(dRate)
	addedMs := ms(median(added))
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(median(dRate), "direct-tok/s")
	b.ReportMetric(median(aRate), "agent-tok/s")
	b.ReportMetric(ratio, "tok/s-ratio")
	b.ReportMetric(ms(median(dTTFT)), "direct-ttft-ms")
	b.ReportMetric(ms(median(aTTFT)), "agent-ttft-ms")
	b.ReportMetric(addedMs, "added-ttft-ms")
	b.ReportMetric(ms(median(tok)), "tokenize-ms")
	b.Logf("agent vs direct, mid model (%s): decode %.1f vs %.1f tok/s over %d pairs of %d tokens, "+
		"ratio %.3f (target ≥ 0.97: %s); TTFT %.2f vs %.2f ms over %d pairs, added %.2f ms (target ≤ 2 ms: %s), "+
		"of which a /tokenize round trip to the runner (the agent's prefill guard) takes %.2f ms",
		others, median(aRate), median(dRate), len(aRate), genTokens, ratio, verdict(ratio >= 0.97),
		ms(median(aTTFT)), ms(median(dTTFT)), len(added), addedMs, verdict(addedMs <= 2), ms(median(tok)))
}

// BenchmarkDecodeVsBandwidth relates single-stream decode to this machine's memory
// bandwidth, both measured in this run: decode streams on the mid model (its runner's
// socket, no agent in between) alternate with bandwidth passes over a 1 GiB buffer.
// Decoding one token reads every weight once (the output matrix is tied to the token
// embeddings), so tok/s × weight bytes is the bandwidth decode achieves. Metrics:
//
//	tok/s           median decode rate
//	weight-MB       the model's weight bytes (its GGUF file)
//	read-GB/s       best sequential-read bandwidth (as many goroutines as CPUs)
//	read-1cpu-GB/s  the same with one goroutine (the runner may use fewer threads than CPUs)
//	copy-GB/s       best copy bandwidth (bytes read + written)
//	decode-GB/s     tok/s × weight bytes
//	efficiency      decode-GB/s / read-GB/s
func BenchmarkDecodeVsBandwidth(b *testing.B) {
	const rounds = 4
	a := startAgent(b, served{name: modelMid, ctx: 1024})
	direct := a.direct(modelMid)
	fi, err := os.Stat(modelPath(b, modelMid))
	if err != nil {
		b.Fatal(err)
	}
	weights := float64(fi.Size())
	direct.mustChat(b, modelMid, prompt, genTokens, nil)
	bw := newBandwidth()
	b.Cleanup(func() {
		bw = nil
		debug.FreeOSMemory() // give the buffer back before the next benchmark
	})

	var rates []float64
	var read, read1, cp float64
	cpu := startCPU(a.cmd.Process.Pid)
	for b.Loop() {
		for range rounds {
			read = max(read, bw.read(3, bw.workers))
			read1 = max(read1, bw.read(1, 1))
			cp = max(cp, bw.copy(2))
			rates = append(rates, direct.mustChat(b, modelMid, prompt, genTokens, nil).DecodeRate())
		}
	}

	rate := median(rates)
	decode := rate * weights
	eff := decode / read
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(rate, "tok/s")
	b.ReportMetric(weights/1e6, "weight-MB")
	b.ReportMetric(read/1e9, "read-GB/s")
	b.ReportMetric(read1/1e9, "read-1cpu-GB/s")
	b.ReportMetric(cp/1e9, "copy-GB/s")
	b.ReportMetric(decode/1e9, "decode-GB/s")
	b.ReportMetric(eff, "efficiency")
	b.Logf("decode vs memory bandwidth (%s): %.1f tok/s × %.1f MB = %.2f GB/s; memory read %.2f GB/s "+
		"(%d goroutines; %.2f GB/s with one), copy %.2f GB/s; efficiency %.2f of the read bandwidth (%.2f of one CPU's)",
		others, rate, weights/1e6, decode/1e9, read/1e9, bw.workers, read1/1e9, cp/1e9, eff, decode/read1)
}

// BenchmarkConcurrentStreams measures continuous batching: the mid model's runner
// started with --parallel 4 (through the agent), one stream alone against four at once,
// rounds alternating after a warm-up. A round's rate is every completion token over the
// round's wall time (from the first request sent to the last stream finished).
// Metrics:
//
//	1-stream-tok/s   median rate of one stream alone
//	4-streams-tok/s  median aggregate rate of four concurrent streams
//	gain             4-streams-tok/s / 1-stream-tok/s
func BenchmarkConcurrentStreams(b *testing.B) {
	const rounds = 3
	a := startAgent(b, served{name: modelMid, ctx: 1024, parallel: 4})
	round := func(n int) float64 {
		var wg sync.WaitGroup
		streams := make([]stream, n)
		errs := make([]error, n)
		start := time.Now()
		for i := range n {
			wg.Go(func() { streams[i], errs[i] = a.chat(context.Background(), modelMid, prompt, genTokens, nil) })
		}
		wg.Wait()
		wall := time.Since(start)
		tokens := 0
		for i, s := range streams {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			if s.CompletionTokens != genTokens {
				b.Fatalf("stream %d of %d generated %d of %d tokens (finish %q)", i, n, s.CompletionTokens, genTokens, s.FinishReason)
			}
			tokens += s.CompletionTokens
		}
		return float64(tokens) / wall.Seconds()
	}
	round(4)
	round(1)

	var one, four []float64
	cpu := startCPU(a.cmd.Process.Pid)
	for b.Loop() {
		for i := range rounds {
			if i%2 == 0 {
				one = append(one, round(1))
				four = append(four, round(4))
			} else {
				four = append(four, round(4))
				one = append(one, round(1))
			}
		}
	}

	gain := median(four) / median(one)
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(median(one), "1-stream-tok/s")
	b.ReportMetric(median(four), "4-streams-tok/s")
	b.ReportMetric(gain, "gain")
	b.Logf("continuous batching, mid model, --parallel 4 (%s): 1 stream %.1f tok/s, 4 streams %.1f tok/s "+
		"aggregate (%.1f each), gain %.2fx", others, median(one), median(four), median(four)/4, gain)
}

// BenchmarkUnloadIdle times the unload of an idle model through the admin API: the
// model is loaded, serves one short request, and once it holds no lease,
// POST /api/models/{id}/unload?wait=true is timed until its answer carries the unload
// report (drain, stop, settle). Repeated a few times, on the mid model (≈ 225 MB
// resident, inside the settle tolerance of 256 MiB, so the first gauge sample settles
// it) and on a large one (≈ 1 GB, so the settle waits until the host gauge has given
// back the runner's footprint). Metrics:
//
//	unload-ms      median time from the POST to the answer with the report (target ≤ 1 s)
//	max-unload-ms  the slowest
//	report-ms      median duration the report itself gives (drain start → settle end)
//	freed-MB       median bytes the report says were freed
//	resident-MB    median footprint of the runner before it stopped
func BenchmarkUnloadIdle(b *testing.B) {
	for _, model := range []string{modelMid, modelLarge} {
		b.Run("model="+model, func(b *testing.B) { benchUnloadIdle(b, model) })
	}
}

func benchUnloadIdle(b *testing.B, model string) {
	const repeats = 3
	a := startAgent(b, served{name: model, ctx: 1024})

	var took, report []time.Duration
	var freed, resident []float64
	var each []string
	cpu := startCPU(a.cmd.Process.Pid)
	for b.Loop() {
		for i := range repeats {
			if i > 0 {
				a.load(model)
			}
			a.mustChat(b, model, prompt, 8, nil)
			a.poll(10*time.Second, model+" holds no lease", func() bool {
				m := a.model(model)
				return m.Leases == 0 && m.ActiveRequests == 0
			})
			start := time.Now()
			out := a.unload(model)
			d := time.Since(start)
			if !out.Unloaded || out.LastUnload == nil {
				b.Fatalf("unload of an idle, loaded model: unloaded=%v, report %+v", out.Unloaded, out.LastUnload)
			}
			r := out.LastUnload
			if r.FreedBytes < 0 || r.Aborted != 0 {
				b.Fatalf("unload report of an idle model: %+v", *r)
			}
			took, report = append(took, d), append(report, r.Duration)
			freed, resident = append(freed, float64(r.FreedBytes)/1e6), append(resident, float64(r.ResidentBytes)/1e6)
			each = append(each, fmt.Sprintf("%.0f ms %s %.0f MB", ms(d), r.Outcome, float64(r.FreedBytes)/1e6))
		}
	}

	med := median(took)
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(ms(med), "unload-ms")
	b.ReportMetric(ms(slicesMax(took)), "max-unload-ms")
	b.ReportMetric(ms(median(report)), "report-ms")
	b.ReportMetric(median(freed), "freed-MB")
	b.ReportMetric(median(resident), "resident-MB")
	b.Logf("unload of an idle %s model, %d times (%s): %.0f ms median, %.0f ms max (target ≤ 1 s: %s); "+
		"report %.0f ms, freed %.1f MB of %.1f MB resident; each (time, outcome, freed): %s", model, len(took), others,
		ms(med), ms(slicesMax(took)), verdict(slicesMax(took) <= time.Second), ms(median(report)), median(freed),
		median(resident), strings.Join(each, ", "))
}

// BenchmarkITLDuringUnload measures the inter-token latency of the mid model serving a
// stream while another model in the same agent is unloaded (drained, stopped, its
// memory settled), against the same streams with the other model loaded and idle.
// Runs alternate (baseline, unload, unload, baseline, ...); in an unload run the
// victim's POST .../unload?wait=true starts after the 16th text chunk and must answer
// before the stream ends; the victim is reloaded between runs, outside the streams.
// Gaps between consecutive text chunks are pooled over the runs. Metrics:
//
//	baseline-p50-ms, unload-p50-ms  median inter-token latency
//	baseline-p99-ms, unload-p99-ms  p99 inter-token latency
//	baseline-max-ms, unload-max-ms  the largest gap
//	p99-ratio                        unload / baseline (target ≤ 1.1)
//	victim-unload-ms                 median time the victim's unload took
func BenchmarkITLDuringUnload(b *testing.B) {
	for _, victim := range []string{modelSmall, modelMidB} {
		b.Run("victim="+victim, func(b *testing.B) { benchITLDuringUnload(b, victim) })
	}
}

func benchITLDuringUnload(b *testing.B, victim string) {
	const (
		runs      = 5 // of each kind
		unloadAt  = 16
		serveName = modelMid
	)
	a := startAgent(b, served{name: serveName, ctx: 1024}, served{name: victim, ctx: 1024})
	a.mustChat(b, serveName, prompt, genTokens, nil)
	a.mustChat(b, victim, prompt, 8, nil)

	var base, during []time.Duration
	var unloads []time.Duration
	late := 0
	run := func(evict bool) {
		a.load(victim)
		if !evict {
			base = append(base, a.mustChat(b, serveName, prompt, genTokens, nil).Gaps()...)
			return
		}
		var (
			wg          sync.WaitGroup
			began, done time.Time
			out         modelActionResponse
			err         error
		)
		start := time.Now()
		s := a.mustChat(b, serveName, prompt, genTokens, func(n int) {
			if n != unloadAt {
				return
			}
			wg.Go(func() {
				began = time.Now()
				var code int
				code, err = a.call(context.Background(), http.MethodPost, "/api/models/"+victim+"/unload?wait=true", &out)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("POST /api/models/%s/unload?wait=true: %d", victim, code)
				}
				done = time.Now()
			})
		})
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		if !out.Unloaded || out.LastUnload == nil {
			b.Fatalf("unload of %s during a stream: unloaded=%v report %+v", victim, out.Unloaded, out.LastUnload)
		}
		if done.Sub(start) > s.Finish {
			late++ // the unload outlasted the stream: part of it was not measured
		}
		unloads = append(unloads, done.Sub(began))
		during = append(during, s.Gaps()...)
	}
	cpu := startCPU(a.cmd.Process.Pid)
	for b.Loop() {
		for i := range runs {
			run(i%2 == 1)
			run(i%2 == 0)
		}
	}

	bp, up := percentile(base, 99), percentile(during, 99)
	ratio := float64(up) / float64(bp)
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(ms(percentile(base, 50)), "baseline-p50-ms")
	b.ReportMetric(ms(percentile(during, 50)), "unload-p50-ms")
	b.ReportMetric(ms(bp), "baseline-p99-ms")
	b.ReportMetric(ms(up), "unload-p99-ms")
	b.ReportMetric(ms(slicesMax(base)), "baseline-max-ms")
	b.ReportMetric(ms(slicesMax(during)), "unload-max-ms")
	b.ReportMetric(ratio, "p99-ratio")
	b.ReportMetric(ms(median(unloads)), "victim-unload-ms")
	b.Logf("ITL of mid while %s is unloaded, %d+%d runs of %d tokens (%s): p99 %.2f ms vs %.2f ms baseline, "+
		"ratio %.3f (target ≤ 1.1: %s); max %.2f vs %.2f ms; victim unload %.0f ms median, %d of %d outlasted the stream",
		victim, runs, runs, genTokens, others, ms(up), ms(bp), ratio, verdict(ratio <= 1.1),
		ms(slicesMax(during)), ms(slicesMax(base)), ms(median(unloads)), late, len(unloads))
}

func slicesMax(xs []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
