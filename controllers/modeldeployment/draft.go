package modeldeployment

import (
	"context"
	"fmt"

	"github.com/macfleet/macfleet/internal/estimate"
)

// withDraft is res with the memory of the deployment's draft model (k.Draft, none
// when empty) counted, read from its GGUF header as the model's is, for the model's
// engine settings: a replica with a draft holds its weights and its KV cache for
// every slot beside the model (estimate.Draft).
func (r *Reconciler) withDraft(ctx context.Context, k estimateKey, res estimate.Result) (estimate.Result, error) {
	if k.Draft == "" {
		return res, nil
	}
	p, refusal, err := r.besideParams(ctx, "draft", k.Draft)
	if err != nil {
		return res, err
	}
	p.ContextLength, p.Parallel, p.KVCacheType = k.ContextLength*max(k.Parallel, 1), k.Parallel, estimate.KVCacheType(k.KVCacheType)
	d, err := r.Estimate(ctx, p)
	if err != nil {
		return res, fmt.Errorf("draft %s: %w", k.Draft, refusal(err))
	}
	return res.WithDraft(d.DraftBytes()), nil
}
