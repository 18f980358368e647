package hardware

import (
	"runtime"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// PerformanceCores are the cores the thread policy (engine.PolicyThreads) gives a
// runner: on macOS the performance cores (hw.perflevel0.physicalcpu, falling back to
// hw.physicalcpu), elsewhere the physical cores (/proc/cpuinfo, as the gauge reads
// them: logical CPUs / threads per core), else the logical CPUs. It reads the real
// machine, never Overrides: a simulated Mac must not give a runner more threads than
// the host has cores.
func PerformanceCores() int {
	if n := perfLevel0Cores(); n > 0 {
		return n
	}
	if g, err := enginepool.NewGauge(); err == nil {
		if hw, err := g.Hardware(); err == nil && hw.CPUCores > 0 {
			return hw.CPUCores
		}
	}
	return runtime.NumCPU()
}
