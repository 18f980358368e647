package gateway

import (
	"net/http"
	"strings"
	"testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// TestResolve: a model resolves to its deployment, or to the error the gateway
// answers (routing.Table.Resolve's refusal as an API error).
func TestResolve(t *testing.T) {
	deps := []mfv1.ModelDeployment{
		deployment("team-a", "qwen", "", "q7", "chat"),
		deployment("team-b", "qwen", ""),
		deployment("team-b", "llama", "meta/llama-3", "chat"),
		deployment("team-c", "dup1", "same"),
		deployment("team-c", "dup2", "same"),
	}
	tbl := BuildTable(deps, nil, nil)
	admin := tenancy.Identity{Admin: true}
	tests := []struct {
		model  string
		want   string // route ID
		status int
		msg    []string
	}{
		{model: "q7", want: "team-a/qwen"},
		{model: "team-a/qwen", want: "team-a/qwen"},
		{model: "team-b/qwen", want: "team-b/qwen"},
		{model: "team-a/chat", want: "team-a/qwen"},
		{model: "team-b/chat", want: "team-b/llama"},
		{model: "meta/llama-3", want: "team-b/llama"},
		{model: "team-b/meta/llama-3", want: "team-b/llama"},
		{model: "qwen", status: http.StatusBadRequest, msg: []string{"team-a, team-b", `"team-a/qwen"`}},
		{model: "chat", status: http.StatusBadRequest, msg: []string{"team-a, team-b"}},
		{model: "same", status: http.StatusBadRequest, msg: []string{"team-c/dup1, team-c/dup2"}},
		{model: "nope", status: http.StatusNotFound, msg: []string{`"nope"`}},
		{model: "team-a/llama", status: http.StatusNotFound},
		{model: "team-a/", status: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			rt, aerr := resolve(tbl, tt.model, admin)
			if tt.status != 0 {
				if aerr == nil {
					t.Fatalf("resolved to %s, want status %d", rt.ID(), tt.status)
				}
				if aerr.Status != tt.status {
					t.Errorf("status %d, want %d (%s)", aerr.Status, tt.status, aerr.Message)
				}
				for _, m := range tt.msg {
					if !strings.Contains(aerr.Message, m) {
						t.Errorf("message %q lacks %q", aerr.Message, m)
					}
				}
				return
			}
			if aerr != nil {
				t.Fatal(aerr)
			}
			if rt.ID() != tt.want {
				t.Errorf("resolved to %s, want %s", rt.ID(), tt.want)
			}
		})
	}
}
