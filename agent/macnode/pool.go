package macnode

import (
	"context"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// CeilingSetter is what the session lowers with the MacNode's spec.memoryCeiling
// (the agent's pool).
type CeilingSetter interface {
	SetConfiguredCeiling(bytes int64)
}

// NewForPool is the session of an agent serving pool: cfg with the pool's hardware in
// status.hardware, its memory in status.memory, its ceiling lowered by the MacNode's
// spec.memoryCeiling (with cfg.FlagCeiling), and a memory status write after each of
// its loads, unloads and pressure changes.
func NewForPool(cfg Config, pool *enginepool.Pool) (*Session, error) {
	cfg.Hardware = hardware.FromMetal(pool.Hardware())
	cfg.Hardware.PerformanceCores = hardware.PerformanceCores()
	if hw, err := hardware.WithAccelerators(context.Background(), cfg.Hardware, devicegauge.NVIDIA{}); err != nil {
		cfg.Log.Info("Reading the accelerators failed; the MacNode lists none", "err", err.Error())
	} else {
		cfg.Hardware = hw
	}
	cfg.Memory = PoolMemory(pool)
	cfg.Ceiling = poolCeiling{pool}
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	pool.AddObserver(notifyObserver{s})
	return s, nil
}

// poolCeiling configures the pool's ceiling (its resolved ceiling is in status).
type poolCeiling struct{ p *enginepool.Pool }

func (c poolCeiling) SetConfiguredCeiling(bytes int64) { c.p.SetConfiguredCeiling(bytes) }

// notifyObserver asks the session for a memory status write on pool events.
type notifyObserver struct{ s *Session }

func (o notifyObserver) LoadFinished(enginepool.LoadEvent)             { o.s.NotifyChanged() }
func (o notifyObserver) Unloaded(string, enginepool.UnloadReport)      { o.s.NotifyChanged() }
func (o notifyObserver) PressureChanged(_, _ enginepool.PressureLevel) { o.s.NotifyChanged() }
