package models_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestSpeculationEachFamily: each family's greedy answer to a prompt that repeats
// itself (which prompt lookup drafts from) is the same token for token with
// speculation off and on, where the family drafts; a family that cannot cut a
// sequence back (pathsOff) drafts nothing.
func TestSpeculationEachFamily(t *testing.T) {
	text := strings.Repeat("one two three four five six seven eight nine ten ", 12)
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		r := startRunner(t, bin, m.path)
		off, _ := r.speculated(text, runnerapi.SpeculationOff)
		on, details := r.speculated(text, runnerapi.SpeculationOn)
		if !slices.Equal(off, on) {
			t.Fatalf("greedy tokens differ:\n off: %v\n on:  %v", off, on)
		}
		drafts := details != nil && details.AcceptedPredictionTokens+details.RejectedPredictionTokens > 0
		specOff := slices.ContainsFunc(pathsOff[m.family], func(p runnerapi.PathOff) bool { return p.Path == runnerapi.PathSpeculation })
		if drafts == specOff {
			t.Fatalf("drafted %+v with speculation off for the family: %v", details, specOff)
		}
		t.Logf("%s: %d tokens, drafts %+v", m.family, len(on), details)
	})
}

// speculated is the runner's greedy answer's tokens to text with speculation spec,
// and its drafted tokens' counts.
func (r *modelRunner) speculated(text, spec string) ([]string, *runnerapi.CompletionTokensDetails) {
	r.t.Helper()
	c := r.greedyChat(text, 48, map[string]string{runnerapi.HeaderSpeculation: spec})
	var toks []string
	for _, lp := range c.Choices[0].Logprobs.Content {
		toks = append(toks, lp.Token)
	}
	return toks, c.Usage.CompletionTokensDetails
}
