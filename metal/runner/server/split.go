//go:build cgo && !race

package server

import (
	"context"
	"fmt"
	"time"
	"unsafe"

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
}

// DefaultSplitTimeout bounds every read and write on a split worker's link.
const DefaultSplitTimeout = 30 * time.Second

// splitDevices connects to the split workers, one ggml device each.
func (s *Server) splitDevices(ctx context.Context) ([]*netdevice.Device, error) {
	timeout := s.cfg.SplitTimeout
	if timeout <= 0 {
		timeout = DefaultSplitTimeout
	}
	var devs []*netdevice.Device
	for i, w := range s.cfg.Split {
		d, err := netdevice.Connect(ctx, w.Addr, s.cfg.ModelPath, i, timeout)
		if err != nil {
			return nil, err
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
			return nil, err
		}
		s.log.Info("Split worker pushes to the next one directly", "worker", devs[i].Addr, "next", devs[i+1].Addr)
	}
	if len(devs) > 0 && devs[len(devs)-1].HasNext() {
		last := devs[len(devs)-1]
		return nil, fmt.Errorf("split worker %s was started with --next, but it computes the model's last split layers: "+
			"its output goes back to the runner, so no worker follows it (drop --next, or list the worker it reaches after it with --split-worker)",
			last.Addr)
	}
	return devs, nil
}

// splitParams sets the model parameters that give the workers their layers and, on a
// runner with a GPU (Metal) and --gpu-layers above 0, its own layers to its GPU
// (planSplit).
func (s *Server) splitParams(p *llama.ModelParams) error {
	if len(s.split) == 0 {
		return nil
	}
	var gpus []unsafe.Pointer
	nLayer := 0
	if s.cfg.GPULayers > 0 {
		gpus = llama.GPUDevices()
	}
	if len(gpus) > 0 {
		var err error
		if nLayer, err = llama.BlockCount(s.cfg.ModelPath); err != nil {
			return err
		}
	}
	workers := make([]int, len(s.split))
	for i := range s.split {
		workers[i] = s.cfg.Split[i].Layers
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
			p.Devices = append(p.Devices, s.split[d.Index].Handle())
		}
	}
	return nil
}

// checkSplit verifies a loaded split model: the workers took every weight from their
// own files without a mismatch, and the runner still holds at least one layer.
func (s *Server) checkSplit(m *llama.Model) error {
	total := 0
	for i, d := range s.split {
		if err := d.Check(); err != nil {
			return err
		}
		total += s.cfg.Split[i].Layers
	}
	if len(s.split) > 0 && total >= m.NLayer() {
		return fmt.Errorf("the split workers take %d layers but the model has %d: the runner must keep at least one", total, m.NLayer())
	}
	return nil
}

// splitLost is the first failed link among the split workers, nil while all work.
func (s *Server) splitLost() error {
	for _, d := range s.split {
		if err := d.Err(); err != nil {
			return err
		}
	}
	return nil
}

// onSplitLost fails the runner once a split worker is lost: /health reports it, new
// requests are refused, and the runner exits (SplitLostError) so that the agent takes
// the replica out of service as for any runner that died.
func (s *Server) onSplitLost(err error) *runnerapi.Error {
	s.mu.Lock()
	first := s.lostErr == ""
	if first {
		s.lostErr = err.Error()
	}
	s.mu.Unlock()
	if first {
		s.log.Error(err, "A split worker is lost; the runner serves nothing more")
		s.setState(runnerapi.StateFailed, err.Error())
		close(s.lost)
	}
	return runnerapi.Unavailable(runnerapi.CodeSplitWorkerLost, "%v", err)
}

// splitStatus reports the workers' links for /status.
func (s *Server) splitStatus() []runnerapi.SplitWorkerStatus {
	var out []runnerapi.SplitWorkerStatus
	// The workers take the last layers in order (0 when the model did not load).
	first := s.info.NLayer
	for _, w := range s.cfg.Split {
		first -= w.Layers
	}
	first = max(first, 0)
	for i, d := range s.split {
		st := d.Stats()
		ws := runnerapi.SplitWorkerStatus{Addr: d.Addr, Layers: s.cfg.Split[i].Layers, FirstLayer: first,
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

// splitLostMessage is the failed link the runner stopped serving for, empty if none.
func (s *Server) splitLostMessage() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostErr
}

// SplitLostError ends a runner whose split worker was lost (the process exits with
// code 4).
type SplitLostError struct{ Err string }

func (e *SplitLostError) Error() string { return "a split worker is lost: " + e.Err }

// awaitLostSeen lets the agent read the failure on /health (bounded, as after a failed
// load: the exit code and stderr tell it too) and returns the error to exit with.
func (s *Server) awaitLostSeen(ctx context.Context) error {
	select {
	case <-s.failureSeen:
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	case <-s.stopReq:
	}
	return &SplitLostError{Err: s.splitLostMessage()}
}
