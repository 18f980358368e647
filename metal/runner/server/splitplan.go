package server

import "fmt"

// The layers of a split runner (docs/split-model.md, "Layers"): which devices the
// model is loaded on, in which proportions, and how many layers leave the runner's
// CPU. This is the decision; split.go applies it to llama.cpp's model parameters.

// splitDevice is one of a split model's devices: one of the runner's own GPUs or a
// worker, by index (llama.GPUDevices' or the --split-worker order).
type splitDevice struct {
	Local bool
	Index int
}

// splitLayout is a split model's parameters: Devices in llama.cpp's order, one weight
// of Split each, and GPULayers, the layers that leave the runner's CPU.
type splitLayout struct {
	Devices   []splitDevice
	Split     []float32
	GPULayers int
}

// planSplit places a model of nLayer repeating layers whose last layers go to
// workers (workerLayers, in order), on a runner with localGPUs GPUs it may use.
//
// llama.cpp gives the last GPULayers layers to the devices in proportion to Split,
// the device of layer i (of those) being the first whose cumulative share exceeds
// i/GPULayers, and puts the output layer on a device only when GPULayers exceeds the
// repeating layers. So:
//   - without a GPU, the devices are the workers, with their counts: the runner's
//     layers, the input and the output layers stay on its CPU (nLayer is not needed);
//   - with GPUs, the runner's GPUs come first with the runner's layers between them,
//     then the workers, and GPULayers is nLayer: every repeating layer leaves the
//     CPU, the output layer stays on the runner's CPU, never on the last worker.
func planSplit(localGPUs, nLayer int, workerLayers []int) (splitLayout, error) {
	var out splitLayout
	taken := 0
	for _, n := range workerLayers {
		taken += n
	}
	if localGPUs > 0 {
		head := nLayer - taken
		if head < 1 {
			return splitLayout{}, fmt.Errorf("the split workers take %d layers but the model has %d: the runner must keep at least one", taken, nLayer)
		}
		// Whole layers per GPU, so that the boundary with the first worker stays
		// exact (weights summing to an integer compare exactly with i/GPULayers).
		for i := range localGPUs {
			n := head / localGPUs
			if i < head%localGPUs {
				n++
			}
			out.Devices = append(out.Devices, splitDevice{Local: true, Index: i})
			out.Split = append(out.Split, float32(n))
		}
		out.GPULayers = nLayer
	} else {
		out.GPULayers = taken
	}
	for i, n := range workerLayers {
		out.Devices = append(out.Devices, splitDevice{Index: i})
		out.Split = append(out.Split, float32(n))
	}
	return out, nil
}

// splitRefusal is why a model of arch cannot be split across Macs, "" when it can:
// a recurrent or hybrid model's recurrent layers keep a state (the gated delta-net's,
// a Mamba's) whose graph a split worker does not compute, so such a split would fail
// at its first decode; it is refused at the load instead.
func splitRefusal(arch string, recurrent, hybrid bool) string {
	switch {
	case hybrid:
		return fmt.Sprintf("a split of this model is refused: its recurrent layers keep a state beside the attention cache (%s), "+
			"which split workers do not compute; serve it on one Mac (without --split-worker)", arch)
	case recurrent:
		return fmt.Sprintf("a split of this model is refused: its layers keep a recurrent state (%s), "+
			"which split workers do not compute; serve it on one Mac (without --split-worker)", arch)
	}
	return ""
}
