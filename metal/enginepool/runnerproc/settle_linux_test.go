package runnerproc

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// hostSample is one Host() call during an unload, by the gauge the pool uses and by
// MemTotal − MemAvailable alone (the gauge before per-CPU free lists were counted).
type hostSample struct {
	at            time.Duration
	used, memOnly int64
}

// recordingGauge is the real Linux gauge, recording every Host() sample next to what
// meminfo alone said.
type recordingGauge struct {
	enginepool.Gauge
	memOnly *enginepool.ProcGauge
	began   time.Time

	mu      sync.Mutex
	samples []hostSample
}

func (g *recordingGauge) Host() (enginepool.HostMemory, error) {
	hm, err := g.Gauge.Host()
	old, oerr := g.memOnly.Host()
	if err == nil && oerr == nil {
		g.mu.Lock()
		g.samples = append(g.samples, hostSample{time.Since(g.began), hm.UsedBytes, old.UsedBytes})
		g.mu.Unlock()
	}
	return hm, err
}

// withoutZoneinfo hides /proc/zoneinfo.
type withoutZoneinfo struct{ fs.FS }

func (w withoutZoneinfo) Open(name string) (fs.File, error) {
	if name == "zoneinfo" {
		return nil, fs.ErrNotExist
	}
	return w.FS.Open(name)
}

// Unloading a runner of several hundred MB of anonymous memory settles at once: the
// host gauge sees what the exit gave back although the kernel parks most of the freed
// pages on its per-CPU free lists (on this kind of VM MemAvailable alone rose by ~30%
// of the footprint at first and the barrier ran out its 5 s).
func TestSettleLargeUnload(t *testing.T) {
	bin := realRunner(t)
	if testing.Short() {
		t.Skip("writes a 720 MB model")
	}
	// Synthesized by a helper built without the race detector (a minute under it):
	// 20 f32 layers, ≈720 MB of weights.
	spec := ggufsynth.Mid()
	spec.Layers, spec.DType = 20, ggufsynth.F32
	model := filepath.Join(t.TempDir(), "large.gguf")
	synth := exec.Command(procBuildHelper(t, "synthmodel"), "-preset", "mid", "-layers", "20", "-dtype", "f32", "-o", model)
	began := time.Now()
	if out, err := synth.CombinedOutput(); err != nil {
		t.Fatalf("synthesizing the model: %v\n%s", err, out)
	}
	t.Logf("synthesized %d params in %v", spec.Params(), time.Since(began).Round(time.Millisecond))

	base, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	gauge := &recordingGauge{Gauge: base,
		memOnly: enginepool.NewProcGauge(withoutZoneinfo{os.DirFS("/proc")}, "/proc", int64(os.Getpagesize()))}
	f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 1, Args: []string{"--mmap=false"}})
	p, err := enginepool.New(enginepool.Config{CeilingBytes: 8 << 30, AgentPID: -1}, f, gauge, nil, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	if err := p.Register(enginepool.ModelSpec{Name: "large", Path: model, Engine: engine.Settings{ContextLength: 512, Parallel: 1},
		EstimatedBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := p.Load(ctx, "large"); err != nil {
		t.Fatal(err)
	}

	gauge.began = time.Now()
	report, err := p.Unload(ctx, "large")
	if err != nil || report == nil {
		t.Fatalf("Unload = %+v, %v", report, err)
	}
	gauge.mu.Lock()
	samples := gauge.samples
	gauge.mu.Unlock()
	for i, s := range samples[1:] {
		t.Logf("sample %d at %v: freed %d MB (meminfo alone: %d MB)", i, s.at.Round(time.Millisecond),
			(samples[0].used-s.used)>>20, (samples[0].memOnly-s.memOnly)>>20)
	}
	t.Logf("unload: outcome %s in %v, freed %d MB of %d MB resident", report.Outcome, report.Duration,
		report.FreedBytes>>20, report.ResidentBytes>>20)

	tolerance := max(int64(256<<20), report.ResidentBytes/20)
	if report.ResidentBytes < 400<<20 {
		t.Fatalf("resident %d MB: the runner should hold the model's %d MB of weights", report.ResidentBytes>>20, spec.Params()*4>>20)
	}
	if report.Outcome != enginepool.Settled || report.Duration > time.Second {
		t.Errorf("outcome %s after %v; want Settled within 1s", report.Outcome, report.Duration)
	}
	if d := report.FreedBytes - report.ResidentBytes; d < -tolerance || d > tolerance {
		t.Errorf("freed %d bytes for a resident %d: more than the %d tolerance apart", report.FreedBytes, report.ResidentBytes, tolerance)
	}
	// The settle tolerance (256 MiB, a third of this footprint) cannot tell a gauge
	// that sees the whole exit from one that sees most of it; 15% can (MemAvailable
	// alone showed 0-79% of it at the first sample on this VM; this gauge 94-100%).
	if d := report.FreedBytes - report.ResidentBytes; d < -report.ResidentBytes*15/100 || d > report.ResidentBytes*15/100 {
		t.Errorf("freed %d MB for a resident %d MB: more than 15%% apart", report.FreedBytes>>20, report.ResidentBytes>>20)
	}
}
