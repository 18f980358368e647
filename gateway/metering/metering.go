// Package metering counts what callers use: requests and input, cached and output
// tokens, per API key, namespace and deployment, with the same numbers as the
// responses' usage.
//
// The tokens are counted where they are known exactly: the node agent reads the
// runner's usage of every answer (streamed or not, translated to Responses or
// Anthropic Messages or not) and sends it to the gateway as the Header trailer; the
// gateway, which knows the caller's key, adds it to the counters here.
package metering

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Header is the HTTP trailer in which a node agent reports the usage of an answer
// (see Usage.String); the gateway takes it off and never passes it on.
const Header = "X-Macfleet-Usage"

// Usage is what one answer used: its prompt's tokens (Input), those of them taken
// from the prompt cache (Cached, part of Input) and the tokens generated (Output,
// every choice's).
type Usage struct {
	Input, Cached, Output int64
}

// String is the trailer's value, e.g. "input=12 cached=0 output=5".
func (u Usage) String() string {
	return "input=" + strconv.FormatInt(u.Input, 10) + " cached=" + strconv.FormatInt(u.Cached, 10) +
		" output=" + strconv.FormatInt(u.Output, 10)
}

// Parse reads a trailer written by String. A count that is negative or not an int64
// makes the whole report unreadable; a count too large for its request is Clamp's.
func Parse(s string) (Usage, error) {
	var u Usage
	seen := 0
	for f := range strings.FieldsSeq(s) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || n < 0 {
			return Usage{}, fmt.Errorf("usage %q: %q is not name=count", s, f)
		}
		switch k {
		case "input":
			u.Input = n
		case "cached":
			u.Cached = n
		case "output":
			u.Output = n
		default:
			continue // a newer agent's count: ignored
		}
		seen++
	}
	if seen == 0 {
		return Usage{}, fmt.Errorf("usage %q counts nothing", s)
	}
	return u, nil
}

// Add is u plus o, each count saturating at MaxCount (AddCount).
func (u Usage) Add(o Usage) Usage {
	return Usage{Input: AddCount(u.Input, o.Input), Cached: AddCount(u.Cached, o.Cached), Output: AddCount(u.Output, o.Output)}
}

// Meter holds the usage counters. Keys are labelled by their Secret's namespace and
// name; an admin key of the keys file (or a gateway without keys) counts under
// empty namespace and key labels.
type Meter struct {
	// Requests and Tokens are exported for a registry that hands back the series
	// of a previous Meter in the same process (a restarted gateway keeps counting).
	Requests *prometheus.CounterVec
	Tokens   *prometheus.CounterVec
}

// Token kinds, the "type" label of macfleet_usage_tokens_total.
const (
	TypeInput  = "input"
	TypeCached = "cached"
	TypeOutput = "output"
)

// NewMeter makes the counters, to be registered.
func NewMeter() *Meter {
	labels := []string{"namespace", "key", "deployment"}
	return &Meter{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_usage_requests_total",
			Help: "Requests a replica answered with usage, by the caller key's namespace and name and the deployment.",
		}, labels),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_usage_tokens_total",
			Help: "Tokens used, by the caller key's namespace and name, the deployment and type: input (the prompt), " +
				"cached (the part of input taken from the prompt cache), output (generated).",
		}, append(labels, "type")),
	}
}

// Record counts one answer of deployment (namespace/name) to id.
func (m *Meter) Record(id tenancy.Identity, deployment string, u Usage) {
	m.Requests.WithLabelValues(id.Namespace, id.Name, deployment).Inc()
	for _, c := range [...]struct {
		kind string
		n    int64
	}{{TypeInput, u.Input}, {TypeCached, u.Cached}, {TypeOutput, u.Output}} {
		if c.n > 0 {
			m.Tokens.WithLabelValues(id.Namespace, id.Name, deployment, c.kind).Add(float64(c.n))
		}
	}
}
