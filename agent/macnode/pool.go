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
	SetConfiguredCeiling(bytes int64) enginepool.Ceiling
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
	cfg.Ceiling = pool
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	pool.AddObserver(s)
	return s, nil
}

// The session observes the pool (enginepool.Observer): each load, unload and
// pressure change asks for a memory status write.

// LoadFinished asks for a memory status write.
func (s *Session) LoadFinished(enginepool.LoadEvent) { s.NotifyChanged() }

// Unloaded asks for a memory status write.
func (s *Session) Unloaded(string, enginepool.UnloadReport) { s.NotifyChanged() }

// PressureChanged asks for a memory status write.
func (s *Session) PressureChanged(_, _ enginepool.PressureLevel) { s.NotifyChanged() }
