package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// TestServiceAccountTokenCallers: a credential shaped like a ServiceAccount token
// that is not a key is reviewed; its ServiceAccount's namespace is scoped like a key
// of that namespace; a refused token is a 401 saying why, an unreviewable one a 503 to
// retry; a key-shaped unknown credential is never sent for review.
func TestServiceAccountTokenCallers(t *testing.T) {
	const (
		tokTeamA = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"
		refused  = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
		broken   = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ5In0.c2ln"
	)
	var reviews atomic.Int32
	review := func(_ context.Context, tok string) (tenancy.Identity, error) {
		reviews.Add(1)
		switch tok {
		case tokTeamA:
			return tenancy.Identity{Namespace: "team-a", Name: satoken.NamePrefix + "ci"}, nil
		case refused:
			return tenancy.Identity{}, &satoken.RefusedError{Reason: `the token is not for audience "macfleet"`}
		}
		return tenancy.Identity{}, errors.New("connection refused")
	}
	up := newScopedUpstream(t)
	g := scopedGateway(t, up.host(), Options{Identify: identifyTest, ReviewToken: review})
	for _, tc := range []struct {
		name, token, model string
		want               int
		contains           string
		reviewed           bool
	}{
		{name: "its namespace's deployment", token: tokTeamA, model: "chat", want: 200, contains: `"team-a/chat-r"`, reviewed: true},
		{name: "granted to its namespace", token: tokTeamA, model: "team-b/granted", want: 200, contains: `"team-b/granted-r"`, reviewed: true},
		{name: "another team's", token: tokTeamA, model: "team-b/secret", want: 404, contains: "model_not_found", reviewed: true},
		{name: "refused", token: refused, model: "chat", want: 401, contains: `invalid ServiceAccount token: the token is not for audience`, reviewed: true},
		{name: "not reviewable", token: broken, model: "chat", want: 503, contains: openaierr.CodeTokenReview, reviewed: true},
		{name: "a key", token: keyTeamA, model: "chat", want: 200, contains: `"team-a/chat-r"`},
		{name: "an unknown key", token: "0123456789abcdef0123", model: "chat", want: 401, contains: "invalid API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reviews.Load()
			resp, body := postPath(t, g.url+"/v1/chat/completions", `{"model":"`+tc.model+`","max_tokens":1,"messages":[]}`,
				"Authorization", "Bearer "+tc.token)
			if resp.StatusCode != tc.want || !strings.Contains(body, tc.contains) {
				t.Errorf("%d %s, want %d containing %q", resp.StatusCode, body, tc.want, tc.contains)
			}
			if tc.want == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				t.Errorf("a 503 without Retry-After")
			}
			if got := reviews.Load() != before; got != tc.reviewed {
				t.Errorf("reviewed %v, want %v", got, tc.reviewed)
			}
		})
	}
}
