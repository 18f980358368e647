//go:build cgo && !race

package server

import (
	"runtime"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// backendsOnce loads the backend directory's libraries once per process: ggml's
// registry is global, and a library registered twice would offer its devices twice.
var (
	backendsOnce   sync.Once
	backendsReport llama.BackendReport
)

// loadBackends registers the accelerator backends of dir with ggml (once) and logs
// what it found: each library loaded or why not, or that the runner computes on its
// compiled-in backends.
func loadBackends(dir string, log logr.Logger) {
	backendsOnce.Do(func() {
		backendsReport = llama.LoadBackends(dir)
		log.Info("Accelerator backends", "summary", backendsReport.Summary())
	})
}

// deviceMemorySeparate: on a Mac the GPU computes in unified memory, which the
// process's footprint already counts; elsewhere an accelerator's memory is its own.
var deviceMemorySeparate = runtime.GOOS != "darwin"

// deviceBytes is the runner's own allocation on accelerators: the model's weights and
// every context's KV cache and compute buffers.
func deviceBytes(m *llama.Model, lctxs []*llama.Context) int64 {
	n := m.DeviceBytes()
	for _, c := range lctxs {
		n += c.DeviceBytes()
	}
	return int64(n)
}

// acceleratorsEvery bounds how often /status asks the devices for their memory: the
// agent polls /status, a CUDA device answers through its driver, and the backend's
// own copy of ggml logs every answer to stderr.
const acceleratorsEvery = 10 * time.Second

var accel struct {
	sync.Mutex
	at   time.Time
	list []runnerapi.Accelerator
}

// accelerators are the registered devices with their memory, read at most every
// acceleratorsEvery.
func accelerators(now time.Time) []runnerapi.Accelerator {
	accel.Lock()
	defer accel.Unlock()
	if accel.list != nil && now.Sub(accel.at) < acceleratorsEvery {
		return accel.list
	}
	list := []runnerapi.Accelerator{}
	for _, d := range llama.Devices() {
		list = append(list, runnerapi.Accelerator{
			Name: d.Name, Description: d.Description, TotalBytes: int64(d.TotalBytes), FreeBytes: int64(d.FreeBytes),
		})
	}
	accel.at, accel.list = now, list
	return list
}
