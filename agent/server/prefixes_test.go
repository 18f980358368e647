package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestPrefixesRelayedAndFleetHeadersFromAdminsOnly: GET /api/models/{id}/prefixes
// relays the model's runner's prefix events (and counts them); the prefix digests and
// the cache partition reach the runner from an admin caller only: a tenant's digests
// are dropped and its forged partition replaced by its own, so it never hits another
// partition's prefix.
func TestPrefixesRelayedAndFleetHeadersFromAdminsOnly(t *testing.T) {
	const (
		key    = "fleet-k3y"
		tenant = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZW5hbnQifQ.c2ln"
		d1, d2 = "00000000000000d1", "00000000000000d2"
		d3     = "00000000000000d3"
	)
	a := startAgent(t, agentOptions{apiKey: key, pool: enginepool.Config{PromptCacheHotBytes: 64 << 20},
		specs: []enginepool.ModelSpec{tinySpec(t, config.Model{Name: "tiny", Settings: engine.Settings{ContextLength: 1024, Parallel: 1}})},
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			if tok == tenant {
				return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:team-a:app"}, nil
			}
			return tenancy.Identity{}, &satoken.RefusedError{Reason: "unknown token"}
		}})
	relayed := 0
	prefixes := func(query string) runnerapi.PrefixEvents {
		t.Helper()
		resp, b := a.do(http.MethodGet, "/api/models/tiny/prefixes?"+query, nil, a.auth()...)
		var out runnerapi.PrefixEvents
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
			t.Fatalf("GET prefixes?%s: %d %s", query, resp.StatusCode, b)
		}
		relayed += len(out.Events)
		return out
	}
	chat := func(prompt string, header ...string) runnerapi.Usage {
		t.Helper()
		body := map[string]any{"model": "tiny", "max_tokens": 2, "temperature": 0,
			"messages": []map[string]string{{"role": "user", "content": prompt}}}
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, header...)
		var c runnerapi.ChatCompletion
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
		return *c.Usage
	}
	cached := func(u runnerapi.Usage) int {
		if u.PromptTokensDetails == nil {
			return 0
		}
		return u.PromptTokensDetails.CachedTokens
	}
	digests := func(evs []runnerapi.PrefixEvent) []string {
		var out []string
		for _, e := range evs {
			if e.Tier != "" {
				out = append(out, e.Digest)
			}
		}
		return out
	}

	if resp, b := a.do(http.MethodGet, "/api/models/tiny/prefixes", nil, a.auth()...); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("prefixes of a model not loaded: %d %s", resp.StatusCode, b)
	}
	if resp, b := a.do(http.MethodGet, "/api/models/nope/prefixes", nil, a.auth()...); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("prefixes of an unknown model: %d %s", resp.StatusCode, b)
	}
	if resp, b := a.do(http.MethodPost, "/api/models/tiny/load", nil, a.auth()...); resp.StatusCode != http.StatusOK {
		t.Fatalf("load: %d %s", resp.StatusCode, b)
	}
	if resp, b := a.do(http.MethodGet, "/api/models/tiny/prefixes?wait=soon", nil, a.auth()...); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a malformed wait: %d %s", resp.StatusCode, b)
	}
	first := prefixes("")
	if !first.Reset || first.Epoch == "" || len(first.Events) != 0 {
		t.Fatalf("first listing: %+v", first)
	}

	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog while the cat watches. ", 12)
	auth := "Bearer " + key
	chat(prompt, "Authorization", auth, runnerapi.HeaderCachePartition, "victim", runnerapi.HeaderPrefixDigests, d1)
	got := prefixes(fmt.Sprintf("epoch=%s&after=%d&wait=10", first.Epoch, first.Seq))
	if !slices.Equal(digests(got.Events), []string{d1}) || got.Events[0].Tier != runnerapi.TierHot || got.Events[0].Tokens == 0 {
		t.Fatalf("after the admin's chat: %+v", got)
	}
	if got.BytesPerToken <= 0 {
		t.Errorf("the relayed events after a save carry no bytes per token: %+v", got)
	}

	// The tenant forges both headers: its digest is dropped, its partition is its own.
	if u := chat(prompt, "Authorization", "Bearer "+tenant, runnerapi.HeaderCachePartition, "victim", runnerapi.HeaderPrefixDigests, d2); cached(u) != 0 {
		t.Errorf("a tenant with another partition's header hit %d cached tokens", cached(u))
	}
	// The next admin chat (one slot: saved after the tenant's) tells when the tenant's
	// state was saved.
	chat(prompt+" Again.", "Authorization", auth, runnerapi.HeaderCachePartition, "victim", runnerapi.HeaderPrefixDigests, d3)
	waited := prefixes(fmt.Sprintf("epoch=%s&after=%d&wait=10", got.Epoch, got.Seq))
	for i := 0; !slices.Contains(digests(waited.Events), d3); i++ {
		if i == 3 {
			t.Fatalf("the admin's digest %s was never reported: %+v", d3, waited)
		}
		waited = prefixes(fmt.Sprintf("epoch=%s&after=%d&wait=10", got.Epoch, waited.Seq))
	}
	if slices.Contains(digests(waited.Events), d2) {
		t.Errorf("the tenant's digest reached the runner: %+v", waited)
	}
	if all := prefixes(""); !all.Reset || !slices.Equal(digests(all.Events), []string{d1, d3}) {
		t.Errorf("the full listing holds %v, want the admin's digests %v", digests(all.Events), []string{d1, d3})
	}
	// The admin's partition still holds the prompt: the tenant's zero was its partition.
	if u := chat(prompt, "Authorization", auth, runnerapi.HeaderCachePartition, "victim"); cached(u) == 0 {
		t.Errorf("the victim's own partition does not hit its prompt: %+v", u)
	}
	a.expectMetric(float64(relayed), "macfleet_agent_prefix_events_total", "model", "tiny")
}
