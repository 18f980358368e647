package autoscaler

import (
	"fmt"
	"time"

	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Sample is one measurement of a deployment's load.
type Sample struct {
	// Time is when the load was measured.
	Time time.Time
	// InFlight is the requests on the deployment's replicas (being generated or
	// waiting for a sequence slot of the replica's engine), summed over the replicas.
	InFlight int32
	// Held is the requests waiting for a replica of the deployment before reaching
	// one (in a gateway's queue, or held while no replica is routable).
	Held int32
}

// Load is what the sample asks the replicas to serve.
func (s Sample) Load() int32 { return s.InFlight + s.Held }

// Policy is a deployment's spec.autoscaling with its defaults resolved.
type Policy struct {
	Min, Max int32
	// Target is the requests in flight per replica aimed for (≥ 1).
	Target int32
	// ScaleDownDelay is how long the load must fit fewer replicas before they go.
	ScaleDownDelay time.Duration
	// StabilizationWindow is how long the load must need more replicas before they come.
	StabilizationWindow time.Duration
	// StaleAfter: a latest sample older than this is no measurement at all.
	StaleAfter time.Duration
}

// Defaults of spec.autoscaling the API server does not fill in (it fills in the others).
const (
	DefaultScaleDownDelay      = 5 * time.Minute
	DefaultStabilizationWindow = 30 * time.Second
)

// PolicyFor resolves md's spec.autoscaling; ok is false when it is not set. The target
// defaults to engine.parallel: a replica is at target when every sequence slot is busy.
func PolicyFor(md *v1alpha1.ModelDeployment, staleAfter time.Duration) (p Policy, ok bool) {
	as := md.Spec.Autoscaling
	if as == nil {
		return Policy{}, false
	}
	p = Policy{
		Min:                 max(ptr.Deref(as.MinReplicas, 1), 0),
		Max:                 max(as.MaxReplicas, 1),
		Target:              max(ptr.Deref(as.TargetInFlight, md.Spec.Engine.Parallel), 1),
		ScaleDownDelay:      DefaultScaleDownDelay,
		StabilizationWindow: DefaultStabilizationWindow,
		StaleAfter:          staleAfter,
	}
	p.Min = min(p.Min, p.Max)
	if as.ScaleDownDelay != nil {
		p.ScaleDownDelay = max(as.ScaleDownDelay.Duration, 0)
	}
	if as.StabilizationWindow != nil {
		p.StabilizationWindow = max(as.StabilizationWindow.Duration, 0)
	}
	return p, true
}

// Need is the replicas a load needs: ceil(load / target).
func (p Policy) Need(load int32) int32 {
	if load <= 0 {
		return 0
	}
	return (load + p.Target - 1) / p.Target
}

// Recommendation is the autoscaler's decision and why.
type Recommendation struct {
	// Replicas is the spec.replicas wanted (the current one when nothing changes).
	Replicas int32
	// Reason is one of the Autoscaling condition's reasons (v1alpha1.Reason…).
	Reason string
	// Message says why, in words; it only changes when the decision or the
	// episode behind it does, so that it can go into status without a write per
	// measurement.
	Message string
}

// Known says whether the decision rests on a fresh measurement.
func (r Recommendation) Known() bool { return r.Reason != v1alpha1.ReasonLoadUnknown }

// Recommend decides a deployment's replicas from its load history (ascending by time),
// its policy, its current spec.replicas and the time:
//
//   - no sample within StaleAfter: keep the replicas (brought within min..max);
//   - fewer replicas than the floor — minReplicas, and 1 while any request is in
//     flight or held — scale up to it at once;
//   - scale up to what the lowest load of the whole stabilization window needs, when
//     that is more than the current replicas (sustained load, not a spike);
//   - scale down to what the highest load of the whole scaleDownDelay needs (never
//     below the floor), when that is fewer; so a deployment with minReplicas 0
//     reaches zero only after scaleDownDelay without a single request;
//   - never beyond maxReplicas.
//
// A window is "whole" when the history reaches back to its start, so that after a
// restart the autoscaler first observes for a window before acting.
func Recommend(history []Sample, p Policy, current int32, now time.Time) Recommendation {
	hist := history
	for len(hist) > 0 && hist[len(hist)-1].Time.After(now) {
		hist = hist[:len(hist)-1]
	}
	if len(hist) == 0 || now.Sub(hist[len(hist)-1].Time) > p.StaleAfter {
		return unknown(hist, p, current)
	}
	latest := hist[len(hist)-1]
	floor := p.Min
	if latest.Load() > 0 {
		floor = max(floor, 1)
	}
	up, upCovered := window(hist, now, p.StabilizationWindow)
	upLoad := minLoad(up)
	upNeed := p.Need(upLoad)
	down, downCovered := window(hist, now, p.ScaleDownDelay)
	downLoad := maxLoad(down)
	downNeed := p.Need(downLoad)

	switch {
	case current < floor:
		to := floor
		if upCovered {
			to = max(to, min(upNeed, p.Max))
		}
		if current < p.Min {
			return Recommendation{Replicas: to, Reason: v1alpha1.ReasonOutsideLimits,
				Message: fmt.Sprintf("scaled up from %d to %d: spec.replicas was below minReplicas (%d)", current, to, p.Min)}
		}
		why := fmt.Sprintf("%d requests arrived with no replica", latest.Load())
		if latest.Load() == 1 {
			why = "a request arrived with no replica"
		}
		return Recommendation{Replicas: to, Reason: v1alpha1.ReasonScaledUp,
			Message: fmt.Sprintf("scaled up from %d to %d: %s", current, to, why)}
	case current > p.Max:
		return Recommendation{Replicas: p.Max, Reason: v1alpha1.ReasonOutsideLimits,
			Message: fmt.Sprintf("scaled down from %d to %d: spec.replicas was above maxReplicas", current, p.Max)}
	case upCovered && upNeed > current && current < p.Max:
		to := min(upNeed, p.Max)
		msg := fmt.Sprintf("scaled up from %d to %d: at least %d requests in flight for %s, target %d per replica",
			current, to, upLoad, p.StabilizationWindow, p.Target)
		if upNeed > p.Max {
			msg += fmt.Sprintf("; the load needs %d, maxReplicas is %d", upNeed, p.Max)
		}
		return Recommendation{Replicas: to, Reason: v1alpha1.ReasonScaledUp, Message: msg}
	case downCovered && downNeed < current && current > floor:
		to := max(downNeed, floor)
		return Recommendation{Replicas: to, Reason: v1alpha1.ReasonScaledDown,
			Message: fmt.Sprintf("scaled down from %d to %d: at most %d requests in flight for %s, target %d per replica",
				current, to, downLoad, p.ScaleDownDelay, p.Target)}
	}
	return hold(hist, p, current, floor, now)
}

// hold explains why the current replicas stay. The explanation names an episode —
// the load needing more replicas (ScaleUpStabilizing, AtMaxReplicas) or fitting fewer
// (ScaleDownDelayed) — and when it began, and it holds while the load keeps coming
// back to that side with no break over StaleAfter (3 measurements): a load hovering
// at a replica boundary is one episode, not one per measurement, so its status is
// written once (see TestAutoscalerWriteBudget). The latest sample picks the side when
// both episodes are open.
func hold(hist []Sample, p Policy, current, floor int32, now time.Time) Recommendation {
	gap := p.StaleAfter
	need := func(s Sample) int32 { return p.Need(s.Load()) }
	upSince, up := episode(hist, now, gap, func(s Sample) bool { return need(s) > current })
	downSince, down := episode(hist, now, gap, func(s Sample) bool { return need(s) < current })
	down = down && current > floor
	switch latest := need(hist[len(hist)-1]); {
	case latest > current:
		down = false
	case latest < current && down:
		up = false
	}
	horizon := now.Add(-max(p.ScaleDownDelay, p.StabilizationWindow))
	rec := Recommendation{Replicas: current}
	switch {
	case up && current >= p.Max:
		rec.Reason = v1alpha1.ReasonAtMaxReplicas
		rec.Message = fmt.Sprintf("the load needs more than maxReplicas (%d replicas at target %d requests in flight each)", p.Max, p.Target)
	case up:
		rec.Reason = v1alpha1.ReasonScaleUpStabilizing
		rec.Message = fmt.Sprintf("the load has needed more than %d replicas %s with no break over %s; scaling up once it has for a whole stabilizationWindow (%s)",
			current, sinceOrOver(upSince, horizon, now), gap, p.StabilizationWindow)
	case down:
		rec.Reason = v1alpha1.ReasonScaleDownDelayed
		rec.Message = fmt.Sprintf("the load has fitted fewer than %d replicas %s with no break over %s; scaling down once it has for a whole scaleDownDelay (%s)",
			current, sinceOrOver(downSince, horizon, now), gap, p.ScaleDownDelay)
	default:
		rec.Reason = v1alpha1.ReasonWithinTarget
		switch {
		case current == 0:
			rec.Message = "0 replicas: no request in flight (minReplicas is 0)"
		case current == p.Min && need(hist[len(hist)-1]) < current:
			rec.Message = fmt.Sprintf("%d replicas, the minimum", current)
		default:
			rec.Message = fmt.Sprintf("%d replicas for the load at target %d requests in flight each", current, p.Target)
		}
	}
	return rec
}

// episode finds the latest episode of samples satisfying in: open when one of them is
// at most gap before now, and begun at the earliest of a chain of them reaching back
// from there with no two consecutive ones more than gap apart.
func episode(hist []Sample, now time.Time, gap time.Duration, in func(Sample) bool) (since time.Time, open bool) {
	i := len(hist) - 1
	for i >= 0 && !in(hist[i]) {
		i--
	}
	if i < 0 || hist[i].Time.Before(now.Add(-gap)) {
		return time.Time{}, false
	}
	first := i
	for k := i - 1; k >= 0; k-- {
		if !in(hist[k]) {
			continue
		}
		if hist[first].Time.Sub(hist[k].Time) > gap {
			break
		}
		first = k
	}
	return hist[first].Time, true
}

// sinceOrOver says since when an episode has lasted, or, once it began before
// horizon — the longest window — for over how long: Prune keeps StaleAfter more than
// that window, so an episode's start is exact up to horizon, and an episode that
// outlasts it keeps one message rather than one per measurement as old samples go.
func sinceOrOver(since, horizon, now time.Time) string {
	if !since.After(horizon) {
		return "for over " + now.Sub(horizon).String()
	}
	return "since " + stamp(since)
}

// unknown keeps the replicas, within min..max, while there is no fresh measurement.
func unknown(hist []Sample, p Policy, current int32) Recommendation {
	rec := Recommendation{Replicas: min(max(current, p.Min), p.Max), Reason: v1alpha1.ReasonLoadUnknown}
	what := "no load measurement yet"
	if len(hist) > 0 {
		what = "no load measurement since " + stamp(hist[len(hist)-1].Time)
	}
	if rec.Replicas != current {
		rec.Message = fmt.Sprintf("%s; replicas brought from %d within minReplicas..maxReplicas (%d..%d)", what, current, p.Min, p.Max)
	} else {
		rec.Message = fmt.Sprintf("%s; keeping %d replicas", what, current)
	}
	return rec
}

// window returns the samples that describe the load over [now-d, now]: the last
// sample at or before now-d (the load in effect when the window opened) and every
// later one. covered says whether the history reaches back to the window's start;
// when it does not, every sample is returned.
func window(hist []Sample, now time.Time, d time.Duration) ([]Sample, bool) {
	start := now.Add(-d)
	for i := len(hist) - 1; i >= 0; i-- {
		if !hist[i].Time.After(start) {
			return hist[i:], true
		}
	}
	return hist, false
}

func minLoad(s []Sample) int32 {
	m := s[0].Load()
	for _, x := range s[1:] {
		m = min(m, x.Load())
	}
	return m
}

func maxLoad(s []Sample) int32 {
	m := s[0].Load()
	for _, x := range s[1:] {
		m = max(m, x.Load())
	}
	return m
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Prune drops the samples no window of p can need at now: those before the last
// sample at or before now − (max(window, delay) + StaleAfter), which is kept. The
// extra StaleAfter lets hold tell where an episode that began within the longest
// window began.
func Prune(history []Sample, p Policy, now time.Time) []Sample {
	w, covered := window(history, now, max(p.ScaleDownDelay, p.StabilizationWindow)+p.StaleAfter)
	if !covered {
		return history
	}
	return w
}
