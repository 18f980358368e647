package macnode

import (
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Memory is the pool's memory account as the MacNode shows it.
type Memory struct {
	CeilingBytes       int64
	SoftWatermarkBytes int64
	HardWatermarkBytes int64
	// UsedBytes is the enforcer's last measurement (runners plus the agent).
	UsedBytes int64
	// AgentBytes is the agent's own part of UsedBytes.
	AgentBytes int64
	// CommittedBytes is the sum of the reservations of loaded and loading models.
	CommittedBytes  int64
	Pressure        v1alpha1.PressureLevel
	Evictions       int64
	FreedBytesTotal int64
}

// MemorySource tells the session the pool's memory account whenever it writes status.
// It is called from the session's goroutine and must not block.
type MemorySource interface {
	NodeMemory() Memory
}

// MemoryFunc adapts a function to MemorySource.
type MemoryFunc func() Memory

// NodeMemory calls f.
func (f MemoryFunc) NodeMemory() Memory { return f() }

// Snapshotter is what PoolMemory needs of the engine pool (*enginepool.Pool).
type Snapshotter interface {
	Snapshot() enginepool.Snapshot
}

// PoolMemory reads the memory account from the pool's snapshot.
func PoolMemory(p Snapshotter) MemorySource {
	return MemoryFunc(func() Memory { return MemoryFromSnapshot(p.Snapshot()) })
}

// MemoryFromSnapshot picks the MacNode's memory figures out of a pool snapshot.
func MemoryFromSnapshot(s enginepool.Snapshot) Memory {
	return Memory{
		CeilingBytes: s.Ceiling.Bytes, SoftWatermarkBytes: s.Ceiling.SoftBytes, HardWatermarkBytes: s.Ceiling.HardBytes,
		UsedBytes: s.UsageBytes, AgentBytes: s.AgentBytes, CommittedBytes: s.CommittedBytes, Pressure: PressureLevel(s.Pressure),
		Evictions: s.Evictions, FreedBytesTotal: s.FreedBytesTotal,
	}
}

// PressureLevel maps the enforcer's level to the API's. An unknown level is OK.
func PressureLevel(l enginepool.PressureLevel) v1alpha1.PressureLevel {
	switch l {
	case enginepool.PressureSoft:
		return v1alpha1.PressureSoft
	case enginepool.PressureHard:
		return v1alpha1.PressureHard
	case enginepool.PressureEmergency:
		return v1alpha1.PressureEmergency
	default:
		return v1alpha1.PressureOK
	}
}
