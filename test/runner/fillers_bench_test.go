package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// BenchmarkSlotLayouts measures what fillers save (engine_fillers.go; docs/
// runner-protocol.md, "Scheduling"): the same streams on slots 0..n-1 (one block of
// ids) and on every fourth slot (n blocks), on a runner with fillers and on one
// without (MACFLEET_FILLERS=0), in the same run, on the synthesized mid model (which
// writes to max_tokens). Each prompt is first pinned to its slot: prompt i is admitted
// while prompts 0..i-1 run (a context of 4096 a slot, which none fills before the
// last is admitted), so it takes slot i, and asked again it goes back there
// (its cached prefix). MACFLEET_BENCH_SLOTS sets the slots (16; the streams are a
// quarter of them).
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench SlotLayouts -benchtime 3x ./test/runner
func BenchmarkSlotLayouts(b *testing.B) {
	slots := 16
	if s, err := strconv.Atoi(os.Getenv("MACFLEET_BENCH_SLOTS")); err == nil && s >= 8 {
		slots = s
	}
	n := slots / 4
	path := model(b, "mid")
	layouts := [2][]int{make([]int, n), make([]int, n)} // one block, every fourth slot
	for i := range n {
		layouts[0][i], layouts[1][i] = i, 4*i
	}
	var rate [2][2]float64 // [fillers, none][one block, every fourth]
	for f, env := range []string{"1", "0"} {
		b.Setenv("MACFLEET_FILLERS", env)
		r := startReady(b, path, "--parallel", strconv.Itoa(slots), "--ctx", strconv.Itoa(slots*4096),
			"--threads", benchThreads("2"))
		pinSlots(b, r, slots)
		for l, ids := range layouts {
			bodies := make([]map[string]any, len(ids))
			for k, i := range ids {
				bodies[k] = chatBody(pinPrompt(i), 32, false)
			}
			var tokens int
			var took time.Duration
			for range b.N {
				c, d, err := streamsRound(r, bodies, runnerapi.SpeculationOff)
				if err != nil {
					b.Fatal(err)
				}
				tokens, took = tokens+c.tokens, took+d
			}
			rate[f][l] = float64(tokens) / took.Seconds()
		}
		if st := r.status(); f == 0 && st.FillerTokens == 0 {
			b.Errorf("the runner with fillers decoded none on every fourth slot")
		} else if f == 1 && st.FillerTokens != 0 {
			b.Errorf("MACFLEET_FILLERS=0: %d filler tokens decoded", st.FillerTokens)
		}
	}
	b.ReportMetric(rate[0][0], "fillers-block-tok/s")
	b.ReportMetric(rate[0][1], "fillers-spread-tok/s")
	b.ReportMetric(rate[1][0], "none-block-tok/s")
	b.ReportMetric(rate[1][1], "none-spread-tok/s")
	b.ReportMetric(rate[0][1]/rate[1][1], "spread-fillers/none")
	b.ReportMetric(rate[0][1]/rate[0][0], "spread/block-fillers")
}

// pinPrompt is prompt i of BenchmarkSlotLayouts: unique from its first words, and long
// enough (over 32 tokens) that asked again it goes back to the slot that holds it.
func pinPrompt(i int) string {
	var w strings.Builder
	for k := range 30 {
		fmt.Fprintf(&w, " topic%d_%d", i, k)
	}
	return fmt.Sprintf("Stream %d:%s. Go on.", i, w.String())
}

// pinSlots puts pinPrompt(i) in slot i of r for i < slots: each is admitted once the
// ones before it run (the lowest free slot), all then aborted.
func pinSlots(b *testing.B, r *runner, slots int) {
	b.Helper()
	var wg sync.WaitGroup
	for i := range slots {
		wg.Go(func() { _, _ = chatUsage(r, chatBody(pinPrompt(i), 4096, false), runnerapi.SpeculationOff) })
		deadline := time.Now().Add(60 * time.Second)
		for r.status().SlotsBusy < i+1 {
			if time.Now().After(deadline) {
				b.Fatalf("pinning: prompt %d not running after 60 s", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var out struct{ Aborted int }
	if code := r.postJSON("/abort", nil, &out); code != 200 || out.Aborted != slots {
		b.Fatalf("pinning: abort %d, %d aborted; want %d", code, out.Aborted, slots)
	}
	wg.Wait()
}
