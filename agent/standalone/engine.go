package standalone

import (
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// Engine is an agent's engine pool with the factory of its runner processes: what
// both agents, standalone and cluster, build the same way (NewEngine).
type Engine struct {
	Pool    *enginepool.Pool
	Factory *runnerproc.ProcessFactory
	// RunnerPath is the runner executable resolved (runnerproc.RunnerExecutable).
	RunnerPath string
	// PerformanceCores are what the thread policy counted (hardware.PerformanceCores).
	PerformanceCores int
}

// NewEngine resolves the runner executable of process (RunnerPath), gives its
// factory the thread policy's cores (hardware.PerformanceCores), and builds the pool
// over gauge (nil: enginepool.NewGauge) with pool.
func NewEngine(process runnerproc.ProcessConfig, pool enginepool.Config, gauge enginepool.Gauge, log logr.Logger) (*Engine, error) {
	if gauge == nil {
		g, err := enginepool.NewGauge()
		if err != nil {
			return nil, fmt.Errorf("measuring memory: %w", err)
		}
		gauge = g
	}
	path, err := runnerproc.RunnerExecutable(process.RunnerPath)
	if err != nil {
		return nil, err
	}
	process.RunnerPath, process.PerformanceCores = path, hardware.PerformanceCores()
	if pool.DeviceGauge == nil {
		pool.DeviceGauge = devicegauge.Detect()
	}
	e := &Engine{Factory: runnerproc.NewProcessFactory(process), RunnerPath: path, PerformanceCores: process.PerformanceCores}
	if e.Pool, err = enginepool.New(pool, e.Factory, gauge, clock.RealClock{}, log.WithName("pool")); err != nil {
		return nil, err
	}
	return e, nil
}
