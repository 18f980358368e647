package modeldeployment

import (
	"context"
	"fmt"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// withDraft is res with the memory of the deployment's draft model (k.Draft, none
// when empty) counted, read from its GGUF header as the model's is, for the model's
// engine settings: a replica with a draft holds its weights and its KV cache for
// every slot beside the model (estimate.Draft).
func (r *Reconciler) withDraft(ctx context.Context, k estimateKey, res estimate.Result) (estimate.Result, error) {
	if k.Draft == "" {
		return res, nil
	}
	src, err := modelsource.Parse(k.Draft)
	if err != nil {
		return res, fmt.Errorf("draft: %w", err)
	}
	if src.Scheme == modelsource.File {
		return res, ErrFileSourceNeedsMemory
	}
	loc, err := r.Resolver.Resolve(ctx, src)
	if err != nil {
		return res, fmt.Errorf("draft %s: %w", k.Draft, err)
	}
	header := r.hubHeader(ctx, src)
	d, err := r.Estimate(ctx, estimate.Params{URL: loc.URL, ContextLength: k.ContextLength * max(k.Parallel, 1),
		Parallel: k.Parallel, KVCacheType: estimate.KVCacheType(k.KVCacheType), Header: header,
		HTTPClient: r.Resolver.HTTPClient, Dial: r.policy.Dialer().DialContext})
	if err != nil {
		return res, fmt.Errorf("draft %s: %w", k.Draft, hubRefusal(src, header != nil, err))
	}
	return res.WithDraft(d.DraftBytes()), nil
}
