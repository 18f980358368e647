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
			if l.Compute != tt.r.Compute {
				t.Errorf("compute = %d, want the estimate's compute buffer %d", l.Compute, tt.r.Compute)
			}
		})
	}
}
