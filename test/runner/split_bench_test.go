package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// BenchmarkSplitModel measures the mid model (8 layers, F16) in one process against
// split across a runner and one worker (4 layers each) and across a runner and two
// workers (3 layers each), in the same run on the same cores: every process computes
// with $MACFLEET_BENCH_THREADS threads (default 1; the stages of one step run one
// after the other, so a split uses no more CPU at a time than one process). Reported:
// single-stream and 4-stream aggregate decode tok/s, time to first token, and per
// generated token the bytes on the split links each way and their round trips
// (docs/benchmarks.md, "A model split across Macs"). The -pipelined cases decode the
// four slots in two llama contexts (--split-pipeline 2), so that the runner computes
// for one while a worker computes for the other: the runner then uses up to twice
// its threads at a time. The -w2w case starts the first worker with --next the second:
// the hidden state between them goes over their peer link, not through the runner
// (peer-B/tok: what the first worker pushed per token).
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench SplitModel -benchtime 3x ./test/runner
func BenchmarkSplitModel(b *testing.B) {
	threads := benchThreads("1")
	m := model(b, "mid")
	const genTokens = 128
	for _, tc := range []struct {
		name     string
		layers   []int
		pipeline string
		w2w      bool
	}{{"one-process", nil, "", false}, {"split-2way", []int{4}, "", false}, {"split-3way", []int{3, 3}, "", false},
		{"split-3way-w2w", []int{3, 3}, "", true},
		{"split-2way-pipelined", []int{4}, "2", false}, {"split-3way-pipelined", []int{3, 3}, "2", false},
		{"split-3way-w2w-pipelined", []int{3, 3}, "2", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var workers []*worker
			if tc.w2w {
				workers = startChain(b, m, len(tc.layers))
			} else {
				for range tc.layers {
					workers = append(workers, startWorker(b, m))
				}
			}
			flags := append(splitFlags(workers, tc.layers...), "--parallel", "4", "--ctx", "8192", "--threads", threads)
			if tc.pipeline != "" {
				flags = append(flags, "--split-pipeline", tc.pipeline)
			}
			r := startReady(b, m, flags...)
			timedStream(b, r, "warm up", 8)

			before, tokens := linkTotals(r.status()), 0
			var rate float64
			var ttft time.Duration
			for range b.N {
				s := timedStream(b, r, fmt.Sprintf("%d split decode", benchRound.Add(1)), genTokens)
				rate += s.decodeRate()
				ttft += s.ttft
				tokens += s.tokens
			}
			after := linkTotals(r.status())
			b.ReportMetric(rate/float64(b.N), "tok/s")
			b.ReportMetric(float64(ttft.Microseconds())/1000/float64(b.N), "ttft-ms")
			if len(workers) > 0 && tokens > 0 {
				b.ReportMetric(float64(after.BytesSent-before.BytesSent)/float64(tokens), "sent-B/tok")
				b.ReportMetric(float64(after.BytesReceived-before.BytesReceived)/float64(tokens), "recv-B/tok")
				b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(tokens), "round-trips/tok")
				link := (after.LinkWaitSeconds - after.WorkerComputeSeconds) - (before.LinkWaitSeconds - before.WorkerComputeSeconds)
				b.ReportMetric(link*1e6/float64(tokens), "link-us/tok")
				b.ReportMetric((after.WorkerComputeSeconds-before.WorkerComputeSeconds)*1e6/float64(tokens), "worker-compute-us/tok")
				if tc.w2w {
					b.ReportMetric(float64(after.PeerBytesSent-before.PeerBytesSent)/float64(tokens), "peer-B/tok")
				}
			}

			var agg float64
			before = linkTotals(r.status())
			for range b.N {
				a, _ := fourStreams(b, r, genTokens)
				agg += a
			}
			if len(workers) > 0 {
				after := linkTotals(r.status())
				steps := float64(4 * genTokens * b.N) // at most; fewer when a stream ends early
				b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/steps, "4-stream-round-trips/tok")
				b.ReportMetric(float64(after.BytesSent-before.BytesSent)/steps, "4-stream-sent-B/tok")
				link := (after.LinkWaitSeconds - after.WorkerComputeSeconds) - (before.LinkWaitSeconds - before.WorkerComputeSeconds)
				b.ReportMetric(link*1e6/steps, "4-stream-link-us/tok")
			}
			b.ReportMetric(agg/float64(b.N), "4-stream-tok/s")
		})
	}
}

// linkTotals sums the split links' counters.
func linkTotals(st runnerapi.Status) runnerapi.SplitWorkerStatus {
	var t runnerapi.SplitWorkerStatus
	for _, w := range st.Split {
		t.BytesSent += w.BytesSent
		t.BytesReceived += w.BytesReceived
		t.RoundTrips += w.RoundTrips
		t.LinkWaitSeconds += w.LinkWaitSeconds
		t.WorkerComputeSeconds += w.WorkerComputeSeconds
		t.PeerBytesSent += w.PeerBytesSent
	}
	return t
}
