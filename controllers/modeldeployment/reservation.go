package modeldeployment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/internal/splitsupport"
)

// maxCachedEstimates bounds the estimate cache; beyond it the oldest entry goes.
const maxCachedEstimates = 4096

// reservation is the memory one replica of a deployment reserves.
type reservation struct {
	// Quantity is the reservation, nil when it is not known.
	Quantity *resource.Quantity
	// Explicit: Quantity is spec.resources.memory, not an estimate.
	Explicit bool
	// Measured is the footprint a loaded replica of the same model and engine
	// settings reported, when Quantity was bounded by it (withMeasurement); else 0.
	Measured int64
	// Err says why Quantity is nil or, with an explicit Quantity, why the layers of a
	// deployment whose replicas may span Macs are not known: no replica may be created
	// then.
	Err error
	// RetryAfter is when to try estimating again after Err.
	RetryAfter time.Duration
	// Layers is the estimate divided over the model's layers, for a deployment whose
	// replicas may span Macs; nil otherwise, when unknown, or when the model may not
	// be split (SplitRefusal).
	Layers *estimate.Layered
	// SplitRefusal says why the replicas of a deployment that may span Macs are placed
	// whole: the model keeps a recurrent state that split workers do not compute
	// (splitsupport.Refusal). Empty otherwise.
	SplitRefusal string
}

// estimateKey identifies one estimate: the same model with the same engine settings
// always needs the same memory.
type estimateKey struct {
	Source        string
	Projector     string
	Draft         string
	ContextLength int32
	Parallel      int32
	KVCacheType   v1alpha1.KVCacheType
}

type estimateEntry struct {
	result   *estimate.Result
	err      error
	failures int
	retryAt  time.Time
}

// estimateCache remembers estimates so that reconciles do not read the GGUF header
// again, and failures with the time of the next attempt so that every reconcile in
// between (replica status changes wake the deployment often) reuses the failure
// instead of hammering the server.
type estimateCache struct {
	mu    sync.Mutex
	m     map[estimateKey]*estimateEntry
	order []estimateKey
}

func (c *estimateCache) get(k estimateKey) (estimateEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return estimateEntry{}, false
	}
	return *e, true
}

// forgetFailures drops the failed estimates, so that the next pass tries again at
// once.
func (c *estimateCache) forgetFailures() {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.order[:0]
	for _, k := range c.order {
		if e := c.m[k]; e != nil && e.err != nil {
			delete(c.m, k)
			continue
		}
		kept = append(kept, k)
	}
	c.order = kept
}

func (c *estimateCache) put(k estimateKey, e estimateEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[estimateKey]*estimateEntry)
	}
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
		if len(c.order) > maxCachedEstimates {
			delete(c.m, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.m[k] = &e
}

// ErrFileSourceNeedsMemory is the estimate failure of a file:// source without
// spec.resources.memory (the API rejects that combination; this guards the controller
// anyway).
var ErrFileSourceNeedsMemory = errors.New("a file:// source needs spec.resources.memory: the controller cannot read the GGUF header of a file on a Mac")

// reservationFor returns the per-replica reservation of md: spec.resources.memory if
// set, else the (cached) estimate from the model's GGUF header, rounded up to whole
// MiB.
func (r *Reconciler) reservationFor(ctx context.Context, md *v1alpha1.ModelDeployment, t v1alpha1.ModelReplicaTemplate) reservation {
	if res := md.Spec.Resources; res != nil && res.Memory != nil {
		q := res.Memory.DeepCopy()
		out := reservation{Quantity: &q, Explicit: true}
		if splits(md) {
			// The override sets the memory; the layers still come from the header, and a
			// replica created without them could never be placed as a gang (layerMemory
			// is immutable): until the header is read, say why and create none.
			est := r.estimated(ctx, md, t)
			out.Layers, out.SplitRefusal = est.Layers, est.SplitRefusal
			if est.Err != nil {
				out.Err = fmt.Errorf("dividing the model over Macs (placement.maxMacsPerReplica %d) needs its header: %w",
					md.Spec.Placement.MaxMacsPerReplica, est.Err)
				out.RetryAfter = est.RetryAfter
			}
		}
		return out
	}
	res := r.estimated(ctx, md, t)
	if !splits(md) {
		res.Layers, res.SplitRefusal = nil, ""
	}
	return res
}

// estimated is the reservation from the (cached) estimate of the model's GGUF header,
// rounded up to whole MiB, with the estimate divided over its layers.
func (r *Reconciler) estimated(ctx context.Context, md *v1alpha1.ModelDeployment, t v1alpha1.ModelReplicaTemplate) reservation {
	k := estimateKey{Source: t.Model.Source, Projector: t.Model.Projector, Draft: t.Model.Draft, ContextLength: t.Engine.ContextLength, Parallel: t.Engine.Parallel, KVCacheType: t.Engine.KVCacheType}
	now := r.Clock.Now()
	e, ok := r.estimates.get(k)
	switch {
	case ok && e.err == nil:
		return fromEstimate(e.result)
	case ok && now.Before(e.retryAt):
		return reservation{Err: e.err, RetryAfter: e.retryAt.Sub(now)}
	}

	if src, perr := modelsource.Parse(k.Source); perr == nil && src.Scheme == modelsource.HTTP {
		// Redirects must stay on hosts the namespace may use.
		ctx = sourcepolicy.ForSource(ctx, md.Namespace, k.Source)
	}
	res, err := r.estimate(ctx, k)
	if err != nil {
		err = fmt.Errorf("estimating the memory of %s: %w", k.Source, err)
		failures := e.failures + 1
		delay := r.retryDelay(failures)
		if refused := (*HubRefusedError)(nil); errors.As(err, &refused) {
			// A hub token written (or given access) is read within its TTL: try again
			// then, whatever the backoff.
			delay = r.HubTokenRetry
		}
		r.estimates.put(k, estimateEntry{err: err, failures: failures, retryAt: now.Add(delay)})
		return reservation{Err: err, RetryAfter: delay}
	}
	r.estimates.put(k, estimateEntry{result: &res})
	return fromEstimate(&res)
}

// fromEstimate is the reservation of res, rounded up to whole MiB, with its layers
// (byLayer).
func fromEstimate(res *estimate.Result) reservation {
	layers, refusal := byLayer(res)
	return reservation{Quantity: roundUpMiB(res.Total), Layers: layers, SplitRefusal: refusal}
}

// byLayer is the estimate divided over its layers, for a replica that may be split
// across Macs: nil when the header gave none, and nil with the reason when the
// model's architecture keeps a recurrent state that split workers do not compute
// (splitsupport), so that such a replica is never planned as a split.
func byLayer(res *estimate.Result) (*estimate.Layered, string) {
	if why := splitsupport.Refusal(res.Dims.Architecture); why != "" {
		return nil, why
	}
	if l, ok := res.ByLayer(); ok {
		return &l, ""
	}
	return nil, ""
}

func (r *Reconciler) estimate(ctx context.Context, k estimateKey) (estimate.Result, error) {
	src, err := modelsource.Parse(k.Source)
	if err != nil {
		return estimate.Result{}, err
	}
	if src.Scheme == modelsource.File {
		return estimate.Result{}, ErrFileSourceNeedsMemory
	}
	ctx, cancel := context.WithTimeout(ctx, r.EstimateTimeout)
	defer cancel()
	loc, err := r.Resolver.Resolve(ctx, src)
	if err != nil {
		return estimate.Result{}, err
	}
	header := r.hubHeader(ctx, src)
	res, err := r.Estimate(ctx, estimate.Params{
		URL: loc.URL,
		// contextLength is per sequence; the engine's KV cache holds every sequence.
		ContextLength: k.ContextLength * max(k.Parallel, 1),
		Parallel:      k.Parallel,
		KVCacheType:   estimate.KVCacheType(k.KVCacheType),
		Header:        header,
		HTTPClient:    r.Resolver.HTTPClient,
		Dial:          r.policy.Dialer().DialContext,
	})
	if err != nil {
		return res, hubRefusal(src, header != nil, err)
	}
	if res, err = r.withProjector(ctx, k, res); err != nil {
		return res, err
	}
	return r.withDraft(ctx, k, res)
}

// retryDelay is the wait after the n-th consecutive failure: EstimateRetryInitial
// doubling up to EstimateRetryMax.
func (r *Reconciler) retryDelay(failures int) time.Duration {
	d := r.EstimateRetryInitial
	for i := 1; i < failures && d < r.EstimateRetryMax; i++ {
		d *= 2
	}
	return min(d, r.EstimateRetryMax)
}

func roundUpMiB(n int64) *resource.Quantity {
	const mib = 1 << 20
	return resource.NewQuantity((n+mib-1)/mib*mib, resource.BinarySI)
}
