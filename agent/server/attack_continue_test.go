package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
)

// TestAttackDirectCallerContinues: a tenant calling the agent directly with its
// ServiceAccount token puts a long conversation in the final assistant message and
// sends X-Macfleet-Continue (and X-Macfleet-Continued-Tokens, the resume header, or
// the token ids its answer was generated as),
// so that the runner reads that message as an answer already generated, not as
// prompt. On 8cd05e0 it was served, its prompt counted without the long message
// (seen: 24 prompt tokens, where the same conversation without the header counts
// 1,158); now it is a
// 403 naming the header and the gateway, and the same request through the fleet's key
// (the gateway's identity here) is still served.
func TestAttackDirectCallerContinues(t *testing.T) {
	const (
		key    = "fleet-k3y"
		tenant = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"
	)
	a := startAgent(t, agentOptions{apiKey: key,
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			if tok == tenant {
				return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}, nil
			}
			return tenancy.Identity{}, &satoken.RefusedError{Reason: "unknown"}
		},
		deploymentOf: func(entry string) string { return "team-a/" + entry },
	})
	body := chatBody("tiny", 4, false)
	body["messages"] = []map[string]string{{"role": "user", "content": "Go on."},
		{"role": "assistant", "content": strings.Repeat("a long conversation read as no prompt ", 40)}}
	for _, h := range [][]string{
		{runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage},
		{runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage, runnerapi.HeaderContinuedTokens, "1"},
		{runnerapi.HeaderResumeStream, "x"},
		{runnerapi.HeaderContinuedTokenIDs, "1,2,3"},
	} {
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, append([]string{"Authorization", "Bearer " + tenant}, h...)...)
		var out runnerapi.ChatCompletion
		if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &out) == nil && out.Usage != nil {
			t.Errorf("a tenant sending %s was served, %d prompt tokens counted", h[0], out.Usage.PromptTokens)
			continue
		}
		if e := decodeError(t, b); resp.StatusCode != http.StatusForbidden || e.Error.Code != "gateway_only_header" ||
			!strings.Contains(e.Error.Message, h[0]) || !strings.Contains(e.Error.Message, "gateway") {
			t.Errorf("a tenant sending %s: %d %s, want a 403 naming the header and the gateway", h[0], resp.StatusCode, b)
		}
	}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, "Authorization", "Bearer "+key,
		runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the fleet key's continuation: %d %s, want it served", resp.StatusCode, b)
	}
}
