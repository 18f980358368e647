package scheduler

import (
	"math/rand/v2"
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

// BenchmarkSolveGangs measures one full solve of the mixed snapshot of BenchmarkSolve
// (1,000 Macs × 10,000 pending replicas) in which one deployment in 200 (50 replicas)
// serves a model larger than any Mac, 150 to 250 GiB over 80 layers, that may span up
// to 8 Macs, and the Macs have links of 10, 40 or 80 Gbit/s. The baseline, nogang, is
// the same snapshot with maxMacsPerReplica 1 (the large replicas are only explained).
// gangs reports how many replicas were placed as gangs, x-nogang how many times
// slower than the baseline the solve ran.
//
// Reproduce: go test -bench SolveGangs -benchmem -run '^$' ./controllers/scheduler/
func BenchmarkSolveGangs(b *testing.B) {
	gangs := withGangs(benchSnapshot(1000, 10000, []Strategy{BinPack, Spread}, 1), 200, 8)
	single := withGangs(benchSnapshot(1000, 10000, []Strategy{BinPack, Spread}, 1), 200, 1)
	var baseline time.Duration
	for _, sc := range []struct {
		name string
		snap Snapshot
	}{{"nogang", single}, {"gangs", gangs}} {
		b.Run(sc.name, func(b *testing.B) {
			var res Result
			for b.Loop() {
				res = Solve(sc.snap, Options{})
			}
			split := 0
			for _, bd := range res.Bindings {
				if bd.Shards != nil {
					split++
				}
			}
			b.ReportMetric(float64(len(res.Bindings)), "bound")
			b.ReportMetric(float64(split), "gangs")
			perOp := b.Elapsed() / time.Duration(b.N)
			if baseline == 0 {
				baseline = perOp
				return
			}
			b.ReportMetric(float64(perOp)/float64(baseline), "x-nogang")
		})
	}
}

// withGangs turns one deployment in every of snap's into a model larger than any Mac
// that may span maxNodes Macs, and gives the Macs link speeds.
func withGangs(snap Snapshot, every, maxNodes int) Snapshot {
	rng := rand.New(rand.NewPCG(27, 27))
	for i := range snap.Nodes {
		snap.Nodes[i].LinkBandwidth = []int64{10e9, 40e9, 80e9}[rng.IntN(3)]
	}
	models := map[string]LayerModel{}
	for i := range snap.Pending {
		r := &snap.Pending[i]
		m, ok := models[r.Deployment]
		if !ok {
			if len(models)%every == 0 {
				size := (150 + rng.Int64N(100)) * gi
				m = LayerModel{Layers: 80, PerLayer: (size - 4*gi) / 80, Head: 4 * gi, Worker: gi / 2}
			}
			models[r.Deployment] = m
		}
		if m.Layers == 0 {
			continue
		}
		r.Layers, r.MaxNodes, r.Reserves, r.NodeSelector = m, maxNodes, true, nil
		r.Memory = m.Head + int64(m.Layers)*m.PerLayer
	}
	return snap
}
