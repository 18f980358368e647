package modeldeployment

import (
	"context"
	"fmt"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// withProjector is res with the memory of the deployment's projector (k.Projector,
// none when empty) counted, read from its GGUF header as the model's is: a replica
// that answers images holds the projector and its encoder beside the model.
func (r *Reconciler) withProjector(ctx context.Context, k estimateKey, res estimate.Result) (estimate.Result, error) {
	if k.Projector == "" {
		return res, nil
	}
	src, err := modelsource.Parse(k.Projector)
	if err != nil {
		return res, fmt.Errorf("projector: %w", err)
	}
	if src.Scheme == modelsource.File {
		return res, ErrFileSourceNeedsMemory
	}
	loc, err := r.Resolver.Resolve(ctx, src)
	if err != nil {
		return res, fmt.Errorf("projector %s: %w", k.Projector, err)
	}
	header := r.hubHeader(ctx, src)
	pb, err := estimate.Projector(ctx, estimate.Params{URL: loc.URL, Header: header, HTTPClient: r.Resolver.HTTPClient,
		Dial: r.policy.Dialer().DialContext})
	if err != nil {
		return res, fmt.Errorf("projector %s: %w", k.Projector, hubRefusal(src, header != nil, err))
	}
	return res.WithProjector(pb), nil
}
