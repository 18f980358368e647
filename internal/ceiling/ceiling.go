// Package ceiling decides how much memory a Mac may give to models: the one
// precedence of every bound on a Mac's memory ceiling, used by the agent (which
// applies it to its engine pool) and by the scheduler and the macnode controller
// (which place replicas by it and say when a Mac claims more than it may have).
//
// A Mac's agent measures its hardware and reports a ceiling in its MacNode's status.
// A compromised Mac can report anything, so the control plane believes the report
// only up to bounds a Mac cannot raise: the operator's spec.memoryCeiling (which
// node identities may not set, see config/admission/node-claims.yaml); the unified
// memory the agent measured, the smaller of what it reports now and what it reported
// when the controller first saw it (status.effectiveCeiling.measuredMemory, which a
// node may not write: Apple Silicon memory cannot grow); and the largest unified
// memory any configuration of the reported chip has (ChipMemory). A Mac that claims
// a bigger chip later therefore gains nothing; one that lies from its first report on
// is bounded only by its chip's largest memory and spec.memoryCeiling.
package ceiling

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Source names the bound a ceiling comes from.
type Source string

const (
	// SourceReported: the ceiling the agent reports (status.memory.ceiling).
	SourceReported Source = "Reported"
	// SourceFlag: the agent's --memory-ceiling.
	SourceFlag Source = "AgentFlag"
	// SourceOperator: the MacNode's spec.memoryCeiling.
	SourceOperator Source = "Operator"
	// SourceMeasured: the unified memory the agent measured (Measured).
	SourceMeasured Source = "Measured"
	// SourceChip: the largest unified memory of the reported chip (ChipMemory).
	SourceChip Source = "Chip"
)

// Bounds are the bounds on a Mac's memory ceiling, in bytes; zero or negative means
// the bound is not set.
type Bounds struct {
	// Reported is the ceiling the agent reports (status.memory.ceiling); the agent
	// itself leaves it zero (its pool derives the ceiling from the hardware).
	Reported int64
	// Flag is the agent's --memory-ceiling.
	Flag int64
	// Operator is the MacNode's spec.memoryCeiling.
	Operator int64
	// Measured is the unified memory the agent measured (Measured); the agent leaves
	// it zero.
	Measured int64
	// Chip is ChipMemory of the reported chip; the agent leaves it zero.
	Chip int64
}

// Ceiling is a resolved ceiling and the bound it comes from.
type Ceiling struct {
	// Bytes is the ceiling; zero when no bound is set.
	Bytes int64
	// Source is the bound that decided it; "" when no bound is set.
	Source Source
}

// Resolve is the smallest bound that is set. On a tie the earlier of Reported, Flag,
// Operator, Measured and Chip wins, so that a Mac reporting exactly its bound is not
// said to be capped.
func Resolve(b Bounds) Ceiling {
	var c Ceiling
	for _, bound := range []struct {
		bytes int64
		src   Source
	}{{b.Reported, SourceReported}, {b.Flag, SourceFlag}, {b.Operator, SourceOperator}, {b.Measured, SourceMeasured}, {b.Chip, SourceChip}} {
		if bound.bytes > 0 && (c.Source == "" || bound.bytes < c.Bytes) {
			c = Ceiling{Bytes: bound.bytes, Source: bound.src}
		}
	}
	return c
}

// Agent is the ceiling the agent configures its pool with: the smaller of its
// --memory-ceiling and the MacNode's spec.memoryCeiling, 0 when neither is set (the
// pool then derives it from the hardware alone).
func Agent(flag, operator int64) int64 {
	return Resolve(Bounds{Flag: flag, Operator: operator}).Bytes
}

// Node is what the control plane believes of a MacNode: its reported ceiling capped
// by spec.memoryCeiling, by its measured memory (Measured) and by the largest memory
// of its chip. ok is false while the agent has reported no ceiling (the node is not
// ready for placement).
func Node(mn *v1alpha1.MacNode) (c Ceiling, ok bool) {
	if mn.Status.Memory.Ceiling == nil {
		return Ceiling{}, false
	}
	b := Bounds{Reported: mn.Status.Memory.Ceiling.Value()}
	if s := mn.Spec.MemoryCeiling; s != nil {
		b.Operator = s.Value()
	}
	b.Measured = Measured(mn)
	b.Chip, _ = ChipMemory(mn.Status.Hardware.Chip)
	c = Resolve(b)
	if b.Reported <= 0 {
		// A zero or negative report is no capacity, whatever the bounds say.
		return Ceiling{Bytes: max(b.Reported, 0), Source: SourceReported}, true
	}
	return c, true
}

// Measured is the unified memory mn's agent measured: the smaller of what it reports
// now (status.hardware.unifiedMemory) and what it reported when the controller first
// saw it (status.effectiveCeiling.measuredMemory); 0 when it reported none.
func Measured(mn *v1alpha1.MacNode) int64 {
	var m int64
	for _, q := range []*resource.Quantity{mn.Status.Hardware.UnifiedMemory, FirstMeasured(mn)} {
		if q != nil && q.Value() > 0 && (m == 0 || q.Value() < m) {
			m = q.Value()
		}
	}
	return m
}

// FirstMeasured is the measured memory the controller keeps for mn
// (status.effectiveCeiling.measuredMemory): the one kept already, else the one the
// agent reports now, else nil.
func FirstMeasured(mn *v1alpha1.MacNode) *resource.Quantity {
	if e := mn.Status.EffectiveCeiling; e != nil && e.MeasuredMemory != nil && e.MeasuredMemory.Value() > 0 {
		return e.MeasuredMemory
	}
	if q := mn.Status.Hardware.UnifiedMemory; q != nil && q.Value() > 0 {
		return q
	}
	return nil
}
