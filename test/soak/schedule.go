// Package soak is the chaos soak (`make soak`): a local fleet under steady mixed
// traffic while a seeded schedule of faults kills its processes, cuts its API server,
// fills a Mac's disk and serves a corrupted model; then it checks that every request
// that had not started streaming was answered and that the fleet converged.
//
// The schedule (Plan), the invariants (Check) and the request accounting (Stats) are
// pure and unit-tested; TestSoak wires them to a real fleet.
package soak

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The faults. Kills are SIGKILL; the killed component is started again after the
// fault's Hold, as a supervisor would (a runner is restarted by its agent).
const (
	KillAgent    Kind = "kill-agent"
	KillRunner   Kind = "kill-runner"
	KillManager  Kind = "kill-manager"
	KillGateway  Kind = "kill-gateway"
	CutAPIServer Kind = "cut-apiserver"
	FillDisk     Kind = "fill-disk"
	CorruptModel Kind = "corrupt-model"
)

// Kinds are every kind of fault, in a fixed order.
var Kinds = []Kind{KillAgent, KillRunner, KillManager, KillGateway, CutAPIServer, FillDisk, CorruptModel}

// Fault is one planned fault.
type Fault struct {
	// At is when it starts, from the start of the traffic.
	At time.Duration
	Kind
	// Hold is how long it lasts: the time a killed component stays down, the API
	// server stays cut, the disk stays full, the corrupted deployment stays.
	Hold time.Duration
	// Node is the Mac of KillAgent, KillRunner and FillDisk; Gateway the replica of
	// KillGateway.
	Node    string
	Gateway int
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s at %s for %s", f.Kind, f.At.Round(100*time.Millisecond), f.Hold)
	switch f.Kind {
	case KillAgent, KillRunner, FillDisk:
		s += " on " + f.Node
	case KillGateway:
		s += fmt.Sprintf(" on gateway %d", f.Gateway)
	}
	return s
}

// End is when the fault is over.
func (f Fault) End() time.Duration { return f.At + f.Hold }

// Topology is what the faults can hit.
type Topology struct {
	Nodes    []string
	Gateways int
}

// Gap separates one fault's end from the next one's start in a soak of duration d
// (5s, less in a soak shorter than 150s), so that the fleet has begun to recover from
// one fault (a restarted agent serving again, a cut relay listening again) before the
// next: overlapping faults could take every replica of a model away at once, which no
// retry can hide.
func Gap(d time.Duration) time.Duration { return min(5*time.Second, d/30) }

const (
	// killHold is how long a killed agent, manager or gateway stays down.
	killHold = 2 * time.Second
	// cutHold is how long the API server is cut (shorter in a short soak).
	cutHold = 30 * time.Second
	// fillHold and corruptHold give the agent time to try, fail and report.
	fillHold    = 15 * time.Second
	corruptHold = 15 * time.Second
)

// Window is the part of a soak of duration d in which faults happen: none in the
// first 10% (the traffic warms up) nor the last 15% (the fleet heals while traffic
// still flows).
func Window(d time.Duration) (from, to time.Duration) { return d / 10, d - d*15/100 }

func hold(k Kind, d time.Duration) time.Duration {
	switch k {
	case CutAPIServer:
		return min(cutHold, d/6)
	case FillDisk:
		return min(fillHold, d/9)
	case CorruptModel:
		return min(corruptHold, d/9)
	case KillRunner:
		return time.Second // the agent restarts it; the hold only spaces faults
	default:
		return killHold
	}
}

// Plan is the fault schedule of a soak of duration d: a pure function of (seed, d,
// topology). Every kind appears at least once; rounds of all the kinds in a seeded
// order repeat while they fit in the Window; faults never overlap and are Gap(d)
// apart; targets are drawn from the topology.
func Plan(seed uint64, d time.Duration, topo Topology) ([]Fault, error) {
	if len(topo.Nodes) == 0 || topo.Gateways < 1 {
		return nil, fmt.Errorf("a soak needs at least one node and one gateway, got %+v", topo)
	}
	from, to := Window(d)
	window := to - from
	gap := Gap(d)
	var round time.Duration
	for _, k := range Kinds {
		round += hold(k, d) + gap
	}
	if round > window {
		return nil, fmt.Errorf("a %s soak is too short: its faults need %s in a window of %s", d, round, window)
	}
	rounds := int(window / round)
	rng := rand.New(rand.NewPCG(seed, uint64(d)))
	var faults []Fault
	for range rounds {
		order := append([]Kind(nil), Kinds...)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			f := Fault{Kind: k, Hold: hold(k, d)}
			switch k {
			case KillAgent, KillRunner, FillDisk:
				f.Node = topo.Nodes[rng.IntN(len(topo.Nodes))]
			case KillGateway:
				f.Gateway = rng.IntN(topo.Gateways)
			}
			faults = append(faults, f)
		}
	}
	// The slack beyond the holds and minimal gaps is spread over the gaps by seeded
	// weights.
	slack := window - time.Duration(rounds)*round
	weights := make([]float64, len(faults))
	var total float64
	for i := range weights {
		weights[i] = rng.Float64()
		total += weights[i]
	}
	at := from
	for i := range faults {
		faults[i].At = at
		at = faults[i].End() + gap + time.Duration(float64(slack)*weights[i]/total)
	}
	return faults, nil
}
