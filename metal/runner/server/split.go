//go:build cgo && !race

package server

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// SplitWorker is a worker process (`macfleet-runner worker`) that holds and computes
// some of the model's layers: the runner keeps the first layers and the output layer,
// the workers take the last ones in order (docs/split-model.md).
type SplitWorker struct {
	Addr   string
	Layers int
	// Token opens every connection to Addr (the head agent's split link requires it).
	Token []byte
}

// DefaultSplitTimeout bounds every read and write on a split worker's link.
const DefaultSplitTimeout = 30 * time.Second

// splitLinks is the runner's side of a split model: the workers that hold its last
// layers and, once connected, their links (one ggml device each).
type splitLinks struct {
	log       logr.Logger
	workers   []SplitWorker
	modelPath string
	gpuLayers int
	timeout   time.Duration
	// devs is set by connect, before the model loads.
	devs []*netdevice.Device
}

func newSplitLinks(cfg Config) *splitLinks {
	timeout := cfg.SplitTimeout
	if timeout <= 0 {
		timeout = DefaultSplitTimeout
	}
	return &splitLinks{log: cfg.Log, workers: cfg.Split, modelPath: cfg.ModelPath, gpuLayers: cfg.GPULayers, timeout: timeout}
}

// connect connects to the split workers, one ggml device each.
func (sl *splitLinks) connect(ctx context.Context) error {
	var devs []*netdevice.Device
	for i, w := range sl.workers {
		d, err := netdevice.Connect(ctx, w.Addr, w.Token, sl.modelPath, i, sl.timeout)
		if err != nil {
			return err
		}
		devs = append(devs, d)
	}
	// Worker to worker: a worker started with --next is asked to open its peer link to
	// the next shard's worker; its hidden state then goes there directly. A --next that
	// does not reach that worker fails the load rather than being passed over.
	for i := 0; i+1 < len(devs); i++ {
		if !devs[i].HasNext() {
			continue
		}
		if err := devs[i].Peer(devs[i+1]); err != nil {
			return err
		}
		sl.log.Info("Split worker pushes to the next one directly", "worker", devs[i].Addr, "next", devs[i+1].Addr)
	}
	if len(devs) > 0 && devs[len(devs)-1].HasNext() {
		last := devs[len(devs)-1]
		return fmt.Errorf("split worker %s was started with --next, but it computes the model's last split layers: "+
			"its output goes back to the runner, so no worker follows it (drop --next, or list the worker it reaches after it with --split-worker)",
			last.Addr)
	}
	sl.devs = devs
	return nil
}

// params sets the model parameters that give the workers their layers and, on a
// runner with a GPU (Metal) and --gpu-layers above 0, its own layers to its GPU
// (planSplit).
func (sl *splitLinks) params(p *llama.ModelParams) error {
	if len(sl.devs) == 0 {
		return nil
	}
	var gpus []unsafe.Pointer
	nLayer := 0
	if sl.gpuLayers > 0 {
		gpus = llama.GPUDevices()
	}
	if len(gpus) > 0 {
		var err error
		if nLayer, err = llama.BlockCount(sl.modelPath); err != nil {
			return err
		}
	}
	workers := make([]int, len(sl.devs))
	for i := range sl.devs {
		workers[i] = sl.workers[i].Layers
	}
	plan, err := planSplit(len(gpus), nLayer, workers)
	if err != nil {
		return err
	}
	p.GPULayers, p.Split, p.Devices = plan.GPULayers, plan.Split, nil
	for _, d := range plan.Devices {
		if d.Local {
			p.Devices = append(p.Devices, gpus[d.Index])
		} else {
			p.Devices = append(p.Devices, sl.devs[d.Index].Handle())
		}
	}
	return nil
}

// check verifies a loaded split model: one that split workers can compute
// (splitRefusal), the workers took every weight from their own files without a
// mismatch, and the runner still holds at least one layer.
func (sl *splitLinks) check(m *llama.Model) error {
	if len(sl.devs) == 0 {
		return nil
	}
	arch, _ := m.Meta("general.architecture")
	if why := splitRefusal(arch, m.IsRecurrent(), m.IsHybrid()); why != "" {
		return errors.New(why)
	}
	total := 0
	for i, d := range sl.devs {
		if err := d.Check(); err != nil {
			return err
		}
		total += sl.workers[i].Layers
	}
	if len(sl.devs) > 0 && total >= m.NLayer() {
		return fmt.Errorf("the split workers take %d layers but the model has %d: the runner must keep at least one", total, m.NLayer())
	}
	return nil
}

// lostLink is the first failed link among the split workers, nil while all work.
func (sl *splitLinks) lostLink() error {
	for _, d := range sl.devs {
		if err := d.Err(); err != nil {
			return err
		}
	}
	return nil
}

// status reports the workers' links for /status; nLayer is the model's layers (0
// when it did not load).
func (sl *splitLinks) status(nLayer int) []runnerapi.SplitWorkerStatus {
	var out []runnerapi.SplitWorkerStatus
	// The workers take the last layers in order.
	first := nLayer
	for _, w := range sl.workers {
		first -= w.Layers
	}
	first = max(first, 0)
	for i, d := range sl.devs {
		st := d.Stats()
		ws := runnerapi.SplitWorkerStatus{Addr: d.Addr, Layers: sl.workers[i].Layers, FirstLayer: first,
			BytesSent: st.BytesSent, BytesReceived: st.BytesReceived, RoundTrips: st.RoundTrips, Computes: st.Computes,
			LinkWaitSeconds: st.Wait.Seconds(), WorkerComputeSeconds: st.Compute.Seconds(), AllocatedBytes: int64(st.Allocated),
			MemoryBytes: int64(st.Memory), Device: runnerapi.SplitWorkerDevice{Type: d.Worker.Type, Name: d.Worker.Name},
			PeerLink: st.Peer, PeerBytesSent: st.PeerBytesSent}
		if err := d.Err(); err != nil {
			ws.Error = err.Error()
		}
		out = append(out, ws)
		first += ws.Layers
	}
	return out
}

// SplitLostError ends a runner whose split worker was lost (the process exits with
// code 4).
type SplitLostError struct{ Err string }

func (e *SplitLostError) Error() string { return "a split worker is lost: " + e.Err }
