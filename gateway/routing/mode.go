// Package routing picks a deployment's replica for each request: the routing table
// (every ModelDeployment's routable replicas, indexed by the names clients use, as
// immutable snapshots built from the informers' objects), the resolution of a
// request's model to its deployment, and the balancer that keeps the gateway's count
// of requests in flight per replica and picks one by the routing mode — least load,
// consistent hashing with bounded loads on the prompt's prefix, or the fleet's prompt
// caches through the prefix index.
package routing

import (
	"fmt"
	"strings"
)

// Mode is how the gateway picks a replica of a deployment for a request.
type Mode string

const (
	// PrefixCache routes a conversation to the replica whose prompt cache holds the
	// longest part of it, by the prefix index (package prefixindex), weighted by tier
	// and load (choosePrefix); with no replica holding any of it, by affinity on its
	// prompt_cache_key when it has one, else (and for deployments with the prompt
	// cache off) by least load.
	PrefixCache Mode = "prefix-cache"
	// PrefixAffinity hashes the start of the conversation onto the replicas
	// (consistent hashing with bounded loads).
	PrefixAffinity Mode = "prefix-affinity"
	// LeastLoad takes the replica with the fewest requests in flight.
	LeastLoad Mode = "least-load"
)

// Modes lists the modes, the --routing flag's values.
var Modes = []Mode{PrefixCache, PrefixAffinity, LeastLoad}

// ParseMode reads a --routing value.
func ParseMode(s string) (Mode, error) {
	for _, r := range Modes {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(Modes))
	for i, r := range Modes {
		names[i] = string(r)
	}
	return "", fmt.Errorf("unknown routing %q: use one of %s", s, strings.Join(names, ", "))
}

// ResolveMode is the mode that --routing (set: given on the command line) and the
// older --prefix-affinity select: --prefix-affinity=true is
// --routing=prefix-affinity, and an error when --routing names another mode.
func ResolveMode(routing string, set, prefixAffinity bool) (Mode, error) {
	r, err := ParseMode(routing)
	if err != nil {
		return "", fmt.Errorf("--routing: %w", err)
	}
	if !prefixAffinity {
		return r, nil
	}
	if set && r != PrefixAffinity {
		return "", fmt.Errorf("--prefix-affinity is --routing=%s, but --routing=%s was given: give --routing alone",
			PrefixAffinity, r)
	}
	return PrefixAffinity, nil
}
