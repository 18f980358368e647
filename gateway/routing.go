package gateway

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/routing"
)

// Routing is how the gateway picks a replica of a deployment for a request (package
// routing's Mode).
type Routing = routing.Mode

// The routing modes (see package routing).
const (
	RoutingPrefixCache    = routing.PrefixCache
	RoutingPrefixAffinity = routing.PrefixAffinity
	RoutingLeastLoad      = routing.LeastLoad
)

// Routings lists the modes, the flag's values.
var Routings = routing.Modes

// ParseRouting reads a --routing value.
func ParseRouting(s string) (Routing, error) { return routing.ParseMode(s) }

// ResolveRouting is the mode that --routing (set: given on the command line) and the
// older --prefix-affinity select (routing.ResolveMode).
func ResolveRouting(r string, set, prefixAffinity bool) (Routing, error) {
	return routing.ResolveMode(r, set, prefixAffinity)
}

// The routing table's types (package routing).
type (
	Table   = routing.Table
	Route   = routing.Route
	Backend = routing.Backend
)

// BuildTable computes the routing table from the deployments, replicas and Macs
// (routing.BuildTable).
func BuildTable(deployments []mfv1.ModelDeployment, replicas []mfv1.ModelReplica, nodes []mfv1.MacNode) *Table {
	return routing.BuildTable(deployments, replicas, nodes)
}

// DefaultLoadBound is c in consistent hashing with bounded loads (Options.LoadBound).
const DefaultLoadBound = routing.DefaultLoadBound

// routed records how t's current replica was picked: the routing decisions metric and
// the request's span.
func (g *Gateway) routed(ctx context.Context, t *admission.Ticket) {
	routed := t.Routed()
	if routed == "" {
		return
	}
	g.metrics.routing.WithLabelValues(t.Request().Model, routed).Inc()
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("macfleet.routing", routed),
			attribute.Int("macfleet.prefix.digests", len(t.Request().Hint.Digests)))
	}
}

type prefixDigestsKey struct{}

// prefixDigests are a request's prefix digests: all of them, sent to the agent, and
// those worth routing by (prefixdigest.Conversation.Routable).
type prefixDigests struct{ all, routable []string }

// withPrefixDigests carries a request's prefix digests to its attempts, which send
// them all to the agent (runnerapi.HeaderPrefixDigests) and look for a peer holding
// the routable ones.
func withPrefixDigests(ctx context.Context, all, routable []string) context.Context {
	return context.WithValue(ctx, prefixDigestsKey{}, prefixDigests{all: all, routable: routable})
}

func prefixDigestsFrom(ctx context.Context) prefixDigests {
	d, _ := ctx.Value(prefixDigestsKey{}).(prefixDigests)
	return d
}
