// Package modelfit answers "which of my Macs can serve this model, at which context?"
// from a model's memory estimates at a ladder of contexts (internal/estimate) and
// what each Mac offers: `macfleet models fit` reads a GGUF header remotely, estimates
// it at each context and calls Decide with the fleet's MacNodes (FromMacNode), or with
// one Mac when there is no cluster.
//
// Decide is pure: no client, no clock. A Mac offers models its memory ceiling less
// what its agent uses itself (Capacity), of which the models already loaded have
// committed some (Free), as the scheduler counts them. A model at a context fits a Mac
// now when its estimate is within Free; it fits once freed when it is within Capacity
// only (the Mac's other models would have to go first); else it does not fit. A split
// of one replica across Macs is not considered.
package modelfit

import (
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ceiling"
)

// Mac is what one Mac offers a model.
type Mac struct {
	Name string `json:"name"`
	// Ceiling is the most memory its engine pool may use (the MacNode's effective
	// ceiling); 0 when its agent reported none.
	Ceiling int64 `json:"ceiling"`
	// Committed is the memory reserved by the models it has loaded or is loading.
	Committed int64 `json:"committed"`
	// Agent is the memory its agent uses itself.
	Agent int64 `json:"agent"`
	// Unavailable says why the scheduler places nothing on it now (not ready,
	// cordoned, no ceiling reported, being deleted); empty when it may.
	Unavailable string `json:"unavailable,omitempty"`
}

// Capacity is the memory the Mac offers models when it serves nothing else.
func (m Mac) Capacity() int64 { return max(m.Ceiling-m.Agent, 0) }

// Free is the memory the Mac offers a model now.
func (m Mac) Free() int64 { return max(m.Ceiling-m.Agent-m.Committed, 0) }

// Need is a model's memory at one context.
type Need struct {
	// Context is the context in tokens (per sequence).
	Context int64 `json:"context"`
	// Bytes is the estimated memory of one replica at Context.
	Bytes int64 `json:"bytes"`
}

// Verdict says whether a need fits a Mac.
type Verdict string

const (
	// Fits: the need is within the Mac's free memory now.
	Fits Verdict = "Fits"
	// FitsWhenFreed: the need is within the Mac's capacity but not its free memory:
	// the models it serves now would have to be unloaded first.
	FitsWhenFreed Verdict = "FitsWhenFreed"
	// TooLarge: the need is over the Mac's capacity.
	TooLarge Verdict = "TooLarge"
)

// Cell is one need set against one Mac.
type Cell struct {
	Context int64   `json:"context"`
	Verdict Verdict `json:"verdict"`
	// Left is the Mac's free memory less the need; negative when it does not fit now.
	Left int64 `json:"left"`
}

// MacFit is every need set against one Mac.
type MacFit struct {
	Mac Mac `json:"mac"`
	// Free and Capacity are Mac.Free() and Mac.Capacity().
	Free     int64  `json:"free"`
	Capacity int64  `json:"capacity"`
	Cells    []Cell `json:"cells"`
	// MaxContext is the largest context that fits now (0: none), MaxContextFreed the
	// largest that fits once the Mac's other models are unloaded.
	MaxContext      int64 `json:"maxContext"`
	MaxContextFreed int64 `json:"maxContextFreed"`
}

// Decide sets each need against each Mac, in the order given.
func Decide(macs []Mac, needs []Need) []MacFit {
	out := make([]MacFit, 0, len(macs))
	for _, m := range macs {
		f := MacFit{Mac: m, Free: m.Free(), Capacity: m.Capacity(), Cells: make([]Cell, 0, len(needs))}
		for _, n := range needs {
			c := Cell{Context: n.Context, Left: m.Free() - n.Bytes, Verdict: TooLarge}
			switch {
			case n.Bytes <= m.Free():
				c.Verdict = Fits
				f.MaxContext = max(f.MaxContext, n.Context)
				f.MaxContextFreed = max(f.MaxContextFreed, n.Context)
			case n.Bytes <= m.Capacity():
				c.Verdict = FitsWhenFreed
				f.MaxContextFreed = max(f.MaxContextFreed, n.Context)
			}
			f.Cells = append(f.Cells, c)
		}
		out = append(out, f)
	}
	return out
}

// Ladder is the contexts to estimate a model at: 4k, 8k, 16k, … up to the smaller of
// the model's trained context and MaxLadderContext, with the trained context itself
// last when it is below MaxLadderContext and not a rung. A trained context of 0
// (the header does not say) climbs to 32k.
func Ladder(trained int64) []int64 {
	top := min(trained, MaxLadderContext)
	if trained <= 0 {
		top = 32768
	}
	var out []int64
	for c := int64(MinLadderContext); c <= top; c *= 2 {
		out = append(out, c)
	}
	if top > 0 && (len(out) == 0 || out[len(out)-1] != top) {
		out = append(out, top)
	}
	return out
}

// The ladder's first and largest rungs.
const (
	MinLadderContext = 4096
	MaxLadderContext = 131072
)

// FromMacNode is what mn offers, as the scheduler counts it: its effective ceiling
// (internal/ceiling.Node), the reservations its agent reports committed and the
// agent's own memory.
func FromMacNode(mn *v1alpha1.MacNode) Mac {
	m := Mac{Name: mn.Name}
	c, ok := ceiling.Node(mn)
	m.Ceiling = c.Bytes
	if q := mn.Status.Memory.Committed; q != nil {
		m.Committed = max(q.Value(), 0)
	}
	if q := mn.Status.Memory.Agent; q != nil {
		m.Agent = max(q.Value(), 0)
	}
	switch {
	case !ok:
		m.Unavailable = "its agent has reported no memory ceiling"
	case mn.DeletionTimestamp != nil:
		m.Unavailable = "being deleted"
	case !meta.IsStatusConditionTrue(mn.Status.Conditions, v1alpha1.MacNodeReady):
		m.Unavailable = "not Ready"
	case mn.Spec.Unschedulable:
		m.Unavailable = "cordoned"
	}
	return m
}
