package scheduler

import (
	"testing"
	"time"
)

// BenchmarkSolve measures one full solve of 1,000 Macs × 10,000 pending replicas (see
// benchSnapshot for the fleet's make-up) per strategy mix, next to two baselines run
// on the same snapshot in the same process just before it:
//
//   - reference: referenceSolve, the plain map-based specification with the same output;
//   - firstfit: replicas and nodes in input order, first feasible node, no scores or
//     reasons — the cheapest placement there is.
//
// The solve sub-benchmark reports x-reference and x-firstfit: how many times faster
// than each baseline it ran. bound is the number of replicas placed.
//
// Reproduce: go test -bench . -benchmem -run '^$' ./controllers/scheduler/
func BenchmarkSolve(b *testing.B) {
	const nodes, replicas = 1000, 10000
	scenarios := []struct {
		name       string
		strategies []Strategy
	}{
		{"mixed", []Strategy{BinPack, Spread}},
		{"binpack", []Strategy{BinPack}},
		{"spread", []Strategy{Spread}},
	}
	for _, sc := range scenarios {
		snap := benchSnapshot(nodes, replicas, sc.strategies, 1)
		var reference, firstfit time.Duration
		run := func(name string, solve func(Snapshot) Result, perOp *time.Duration) {
			b.Run(sc.name+"/"+name, func(b *testing.B) {
				var res Result
				for b.Loop() {
					res = solve(snap)
				}
				b.ReportMetric(float64(len(res.Bindings)), "bound")
				if perOp != nil {
					*perOp = b.Elapsed() / time.Duration(b.N)
					return
				}
				solveOp := float64(b.Elapsed()) / float64(b.N)
				if reference > 0 {
					b.ReportMetric(float64(reference)/solveOp, "x-reference")
				}
				if firstfit > 0 {
					b.ReportMetric(float64(firstfit)/solveOp, "x-firstfit")
				}
			})
		}
		run("reference", referenceSolve, &reference)
		run("firstfit", firstFit, &firstfit)
		run("solve", func(s Snapshot) Result { return Solve(s, Options{}) }, nil)
	}
}
