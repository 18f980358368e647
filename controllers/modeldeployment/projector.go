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
	p, refusal, err := r.besideParams(ctx, "projector", k.Projector)
	if err != nil {
		return res, err
	}
	pb, err := estimate.Projector(ctx, p)
	if err != nil {
		return res, fmt.Errorf("projector %s: %w", k.Projector, refusal(err))
	}
	return res.WithProjector(pb), nil
}

// besideParams are the estimate's parameters to read the header of a file beside
// the model (what: "projector", "draft") at source, and how to word the hub's
// refusal of it (hubRefusal).
func (r *Reconciler) besideParams(ctx context.Context, what, source string) (estimate.Params, func(error) error, error) {
	src, err := modelsource.Parse(source)
	if err != nil {
		return estimate.Params{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	if src.Scheme == modelsource.File {
		return estimate.Params{}, nil, ErrFileSourceNeedsMemory
	}
	loc, err := r.Resolver.Resolve(ctx, src)
	if err != nil {
		return estimate.Params{}, nil, fmt.Errorf("%s %s: %w", what, source, err)
	}
	header := r.hubHeader(ctx, src)
	refusal := func(err error) error { return hubRefusal(src, header != nil, err) }
	return estimate.Params{URL: loc.URL, Header: header, HTTPClient: r.Resolver.HTTPClient,
		Dial: r.policy.Dialer().DialContext}, refusal, nil
}
