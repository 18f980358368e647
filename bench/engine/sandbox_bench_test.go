package engine

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// BenchmarkSandboxedVsUnconfined compares the decode rate of a runner confined by the
// sandbox (runner/sandbox: Landlock and a seccomp filter on Linux) with one started
// unconfined, in the same run: two `macfleet serve` agents, --runner-sandbox on and
// off, each with a runner of the mid model; streamed greedy chat completions straight
// to each runner's socket, the two interleaved (the order alternating every pair)
// after a warm-up. Metrics:
//
//	confined-tok/s, unconfined-tok/s   median decode rate
//	tok/s-ratio                        confined / unconfined (target ≥ 0.98)
func BenchmarkSandboxedVsUnconfined(b *testing.B) {
	const pairs = 10
	on := startAgentFlags(b, []string{"--runner-sandbox", "on"}, served{name: modelMid, ctx: 1024})
	off := startAgentFlags(b, []string{"--runner-sandbox", "off"}, served{name: modelMid, ctx: 1024})
	// The comparison means something only if one runner is confined and the other not.
	if c, known := seccomped(b, on.model(modelMid).PID); known && !c {
		b.Fatal("the runner of the agent with --runner-sandbox on runs without a seccomp filter")
	}
	if c, _ := seccomped(b, off.model(modelMid).PID); c {
		b.Fatal("the runner of the agent with --runner-sandbox off runs under a seccomp filter")
	}
	con, unc := on.direct(modelMid), off.direct(modelMid)
	con.mustChat(b, modelMid, prompt, genTokens, nil)
	unc.mustChat(b, modelMid, prompt, genTokens, nil)

	var cRate, uRate []float64
	cpu := startCPU(on.cmd.Process.Pid)
	for b.Loop() {
		for i := range pairs {
			var c, u stream
			if i%2 == 0 {
				c = con.mustChat(b, modelMid, prompt, genTokens, nil)
				u = unc.mustChat(b, modelMid, prompt, genTokens, nil)
			} else {
				u = unc.mustChat(b, modelMid, prompt, genTokens, nil)
				c = con.mustChat(b, modelMid, prompt, genTokens, nil)
			}
			cRate, uRate = append(cRate, c.DecodeRate()), append(uRate, u.DecodeRate())
		}
	}
	ratio := median(cRate) / median(uRate)
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(median(cRate), "confined-tok/s")
	b.ReportMetric(median(uRate), "unconfined-tok/s")
	b.ReportMetric(ratio, "tok/s-ratio")
	b.Logf("sandboxed vs unconfined runner, mid model (%s): decode %.1f vs %.1f tok/s over %d pairs of %d tokens, "+
		"ratio %.3f (target ≥ 0.98: %s)", others, median(cRate), median(uRate), len(cRate), genTokens, ratio, verdict(ratio >= 0.98))
}

// seccomped reports whether process pid runs under a seccomp filter, and whether
// that could be known (/proc, on Linux).
func seccomped(b *testing.B, pid int) (filtered, known bool) {
	b.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if os.IsNotExist(err) {
		return false, false
	}
	if err != nil {
		b.Fatal(err)
	}
	return strings.Contains(string(st), "\nSeccomp:\t2\n"), true
}
