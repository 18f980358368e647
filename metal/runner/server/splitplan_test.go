package server

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlanSplit(t *testing.T) {
	workers := func(idx ...int) []splitDevice {
		var out []splitDevice
		for _, i := range idx {
			out = append(out, splitDevice{Index: i})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		localGPUs int
		nLayer    int
		workers   []int
		want      splitLayout
		wantErr   string
	}{
		{
			// Today's parameters: the workers alone, with their counts; the runner's
			// layers on its CPU. The layer count is not needed.
			name: "no GPU, one worker", nLayer: 0, workers: []int{3},
			want: splitLayout{Devices: workers(0), Split: []float32{3}, GPULayers: 3},
		},
		{
			name: "no GPU, two workers", nLayer: 6, workers: []int{2, 2},
			want: splitLayout{Devices: workers(0, 1), Split: []float32{2, 2}, GPULayers: 4},
		},
		{
			// A runner with --gpu-layers 0 passes no GPU, even on a Mac.
			name: "no GPU, the layer count ignored", nLayer: 80, workers: []int{30, 30},
			want: splitLayout{Devices: workers(0, 1), Split: []float32{30, 30}, GPULayers: 60},
		},
		{
			name: "a GPU, one worker", localGPUs: 1, nLayer: 6, workers: []int{3},
			want: splitLayout{Devices: []splitDevice{{Local: true}, {Index: 0}}, Split: []float32{3, 3}, GPULayers: 6},
		},
		{
			name: "a GPU, two workers", localGPUs: 1, nLayer: 80, workers: []int{30, 30},
			want: splitLayout{Devices: []splitDevice{{Local: true}, {Index: 0}, {Index: 1}}, Split: []float32{20, 30, 30}, GPULayers: 80},
		},
		{
			// The runner's layers are divided in whole layers among its GPUs.
			name: "two GPUs, an odd share", localGPUs: 2, nLayer: 8, workers: []int{3},
			want: splitLayout{Devices: []splitDevice{{Local: true}, {Local: true, Index: 1}, {Index: 0}}, Split: []float32{3, 2, 3}, GPULayers: 8},
		},
		{
			name: "a GPU, the runner keeps no layer", localGPUs: 1, nLayer: 6, workers: []int{3, 3},
			wantErr: "the runner must keep at least one",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planSplit(tc.localGPUs, tc.nLayer, tc.workers)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("planSplit error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("planSplit (-want +got):\n%s", d)
			}
		})
	}
}

// TestPlanSplitGivesEachDeviceItsLayers follows llama.cpp's assignment of layers to
// devices (get_layer_buft_list in llama-model.cpp) on the plan's parameters: every
// worker gets exactly its layers, a GPU runner every layer before the workers', and
// the output layer stays on the runner's CPU.
func TestPlanSplitGivesEachDeviceItsLayers(t *testing.T) {
	for _, tc := range []struct {
		localGPUs, nLayer int
		workers           []int
	}{
		{0, 6, []int{3}}, {0, 6, []int{2, 2}}, {1, 6, []int{3}}, {1, 6, []int{2, 2}},
		{1, 80, []int{30, 30}}, {2, 81, []int{27, 13}}, {1, 7, []int{1, 1, 1, 1, 1, 1}}, {3, 2, []int{1}},
	} {
		p, err := planSplit(tc.localGPUs, tc.nLayer, tc.workers)
		if err != nil {
			t.Fatal(err)
		}
		got := llamaLayerDevices(tc.nLayer, p)
		// Want: the runner's layers on its CPU (-1) or its GPUs, then each worker's.
		var want []string
		head := tc.nLayer
		for _, n := range tc.workers {
			head -= n
		}
		for range head {
			if tc.localGPUs > 0 {
				want = append(want, "gpu")
			} else {
				want = append(want, "cpu")
			}
		}
		for w, n := range tc.workers {
			for range n {
				want = append(want, "worker"+string(rune('0'+w)))
			}
		}
		want = append(want, "cpu") // the output layer
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%d GPUs, %d layers, workers %v: layer devices (-want +got):\n%s", tc.localGPUs, tc.nLayer, tc.workers, d)
		}
	}
}

// llamaLayerDevices is llama.cpp's assignment of the repeating layers and then the
// output layer to the devices of p (float arithmetic as it does it).
func llamaLayerDevices(nLayer int, p splitLayout) []string {
	splits := make([]float32, len(p.Split))
	var sum float32
	for i, w := range p.Split {
		sum += w
		splits[i] = sum
	}
	for i := range splits {
		splits[i] /= sum
	}
	start := max(nLayer-p.GPULayers, 0)
	act := min(p.GPULayers, nLayer+1)
	var out []string
	for il := 0; il <= nLayer; il++ {
		if il < start || il-start >= act {
			out = append(out, "cpu")
			continue
		}
		x := float32(il-start) / float32(act)
		k := 0
		for k < len(splits) && splits[k] <= x {
			k++
		}
		d := p.Devices[k]
		if d.Local {
			out = append(out, "gpu")
		} else {
			out = append(out, "worker"+string(rune('0'+d.Index)))
		}
	}
	return out
}

func TestSplitRefusal(t *testing.T) {
	for _, tc := range []struct {
		arch              string
		recurrent, hybrid bool
		want              string
	}{
		{arch: "llama"},
		{arch: "qwen3moe"},
		{arch: "gpt-oss"},
		{arch: "qwen3next", hybrid: true, want: "its recurrent layers keep a state beside the attention cache (qwen3next)"},
		{arch: "mamba", recurrent: true, want: "its layers keep a recurrent state (mamba)"},
	} {
		got := splitRefusal(tc.arch, tc.recurrent, tc.hybrid)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) || tc.want != "" && !strings.Contains(got, "serve it on one Mac") {
			t.Errorf("%s: %q, want it to say %q and how to serve it", tc.arch, got, tc.want)
		}
	}
}
