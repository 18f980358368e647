package estimate

import "testing"

func TestByLayer(t *testing.T) {
	gib := int64(1) << 30
	tests := []struct {
		name string
		r    Result
		// wantOutside is the weights expected outside the blocks.
		wantOutside int64
		wantOK      bool
	}{
		{
			name: "a 70B-class model at about 4.5 bits",
			r: Result{Weights: 40 * gib, KVCache: 10 * gib, Compute: gib, Overhead: 300 << 20,
				Dims: Dims{Layers: 80, Vocab: 128256, Embd: 8192, Params: 70_600_000_000}},
			// 2 × 128256 × 8192 parameters at 40 GiB / 70.6e9 bytes each.
			wantOutside: 1_278_358_875, wantOK: true,
		},
		{
			name: "a vocabulary larger than the model is capped at half the weights",
			r: Result{Weights: 2 * gib, KVCache: gib, Compute: gib / 4, Overhead: 100 << 20,
				Dims: Dims{Layers: 3, Vocab: 1 << 20, Embd: 4096, Params: 1 << 30}},
			wantOutside: gib, wantOK: true,
		},
		{
			name: "no parameter count: everything in the blocks",
			r: Result{Weights: 7 * gib, KVCache: 2 * gib, Compute: gib / 2, Overhead: 50 << 20,
				Dims: Dims{Layers: 7}},
			wantOutside: 0, wantOK: true,
		},
		{name: "no layers", r: Result{Weights: gib}, wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.r.Total = tt.r.Weights + tt.r.KVCache + tt.r.Compute + tt.r.Overhead
			l, ok := tt.r.ByLayer()
			if ok != tt.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tt.wantOK)
			}
			if !ok {
				return
			}
			if got := l.Head - tt.r.Compute - tt.r.Overhead; got != tt.wantOutside {
				t.Errorf("weights outside the blocks = %d, want %d", got, tt.wantOutside)
			}
			// One shard holding every layer needs the estimate's total, up to the
			// rounding of PerLayer.
			whole := l.Head + l.Layers*l.PerLayer
			if whole < tt.r.Total || whole >= tt.r.Total+l.Layers {
				t.Errorf("head + layers × perLayer = %d, want within [%d, %d)", whole, tt.r.Total, tt.r.Total+l.Layers)
			}
			if l.Worker != RunnerBaseline+tt.r.Compute {
				t.Errorf("worker = %d, want the runner baseline and the compute buffer %d", l.Worker, RunnerBaseline+tt.r.Compute)
			}
			if tt.r.Dims.Vocab > 0 && l.OutputRow != (tt.r.Dims.Vocab+tt.r.Dims.Embd)*4 {
				t.Errorf("output row = %d bytes, want (vocab + embd) × 4", l.OutputRow)
			}
			if l.Compute != tt.r.Compute {
				t.Errorf("compute = %d, want the estimate's compute buffer %d", l.Compute, tt.r.Compute)
			}
		})
	}
}

// TestPipelined: a split head of n llama contexts holds n−1 more compute buffers, as
// does each worker; the head also holds n output buffers of Parallel/n sequences, which
// exceed the one of Parallel sequences only when n_batch bounds the latter's rows.
func TestPipelined(t *testing.T) {
	const row = (128256 + 4096) * 4 // a Llama 3 8B output row
	base := Layered{Layers: 32, PerLayer: 1 << 28, Head: 3 << 30, Worker: 1 << 30, Compute: 300 << 20, Batch: 512, OutputRow: row}
	for _, tt := range []struct {
		name                 string
		parallel             int64
		n                    int
		wantHead, wantWorker int64
	}{
		{"one context", 4, 1, 0, 0},
		{"no setting", 4, 0, 0, 0},
		// 4 slots: 256 rows (64 each) in one context, 2 × 128 in two.
		{"two contexts, rows unbounded", 4, 2, 300 << 20, 300 << 20},
		{"four contexts of one slot", 4, 4, 900 << 20, 900 << 20},
		// 16 slots: one context is bounded at 512 rows, two of 8 slots hold 512 each.
		{"two contexts, one bounded by the batch", 16, 2, 300<<20 + 512*row, 300 << 20},
		{"eight contexts of two slots", 16, 8, 7*(300<<20) + (8*128-512)*row, 7 * (300 << 20)},
		{"unknown parallel: compute only", 0, 2, 300 << 20, 300 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := base
			l.Parallel = tt.parallel
			head, worker := l.Pipelined(tt.n)
			if head != tt.wantHead || worker != tt.wantWorker {
				t.Errorf("Pipelined(%d) = head %d, worker %d; want %d, %d", tt.n, head, worker, tt.wantHead, tt.wantWorker)
			}
		})
	}
}
