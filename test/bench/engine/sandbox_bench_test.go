package engine

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// BenchmarkSandboxedVsUnconfined compares the decode rate of a runner confined by the
// sandbox (metal/runner/sandbox: Landlock and a seccomp filter on Linux) with one started
// unconfined, in the same run: two `macfleet serve` agents, --runner-sandbox on and
// off, each with a runner of the mid model; streamed greedy chat completions straight
// to each runner's socket, in pairs that run at the same time after a warm-up, so
// that the load of a busy machine slows both streams of a pair alike. The ratio is the
// median of the pairs' ratios; the CPU time each runner spends per token (Linux) does
// not depend on the load at all. Metrics:
//
//	confined-tok/s, unconfined-tok/s   median decode rate
//	tok/s-ratio                        median over the pairs of confined / unconfined (target ≥ 0.98)
//	cpu-ratio                          the confined runner's CPU time per token / the unconfined one's
func BenchmarkSandboxedVsUnconfined(b *testing.B) {
	const pairs = 20
	on := startAgentFlags(b, []string{"--runner-sandbox", "on"}, served{name: modelMid, ctx: 1024})
	off := startAgentFlags(b, []string{"--runner-sandbox", "off"}, served{name: modelMid, ctx: 1024})
	onPID, offPID := on.model(modelMid).PID, off.model(modelMid).PID
	// The comparison means something only if one runner is confined and the other not.
	if c, known := seccomped(b, onPID); known && !c {
		b.Fatal("the runner of the agent with --runner-sandbox on runs without a seccomp filter")
	}
	if c, _ := seccomped(b, offPID); c {
		b.Fatal("the runner of the agent with --runner-sandbox off runs under a seccomp filter")
	}
	con, unc := on.direct(modelMid), off.direct(modelMid)
	con.mustChat(b, modelMid, prompt, genTokens, nil)
	unc.mustChat(b, modelMid, prompt, genTokens, nil)

	var p pairedDecode
	cpu := startCPU(on.cmd.Process.Pid)
	for b.Loop() {
		p.run(b, pairs, con, unc, onPID, offPID)
	}
	b.Logf("sandboxed vs unconfined runner, mid model (the unconfined agent's runner among the others): %s",
		p.report(b, cpu, "confined", "unconfined"))
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
