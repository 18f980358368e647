package server

import (
	"net/http"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestContinueHeadersRefusal: the continuation headers pass from the gateway's
// identity only; a request without them passes from anyone.
func TestContinueHeadersRefusal(t *testing.T) {
	with := func(name string) http.Header {
		h := http.Header{}
		if name != "" {
			h.Set(name, "1")
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		header  string
		c       caller
		refused bool
	}{
		{name: "the gateway continues", header: runnerapi.HeaderContinue, c: caller{reportsQueues: true, gateway: true}},
		{name: "the fleet key continues", header: runnerapi.HeaderContinuedTokens, c: caller{reportsQueues: true}},
		{name: "a tenant without the headers", c: caller{}},
		{name: "a tenant continues", header: runnerapi.HeaderContinue, c: caller{}, refused: true},
		{name: "a tenant declares continued tokens", header: runnerapi.HeaderContinuedTokens, c: caller{}, refused: true},
		{name: "a tenant resumes a stream", header: runnerapi.HeaderResumeStream, c: caller{}, refused: true},
		{name: "a tenant names the tokens of its answer", header: runnerapi.HeaderContinuedTokenIDs, c: caller{}, refused: true},
		{name: "the gateway names the tokens of its answer", header: runnerapi.HeaderContinuedTokenIDs, c: caller{reportsQueues: true, gateway: true}},
		{name: "the manager's certificate continues", header: runnerapi.HeaderContinue, c: caller{}, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := continueHeadersRefusal(with(tc.header), tc.c)
			if (e != nil) != tc.refused {
				t.Fatalf("refusal %+v, want refused %v", e, tc.refused)
			}
			if e != nil && (e.Status != http.StatusForbidden || e.Code != codeGatewayHeader) {
				t.Errorf("refusal %+v, want a 403 %s", e, codeGatewayHeader)
			}
		})
	}
}
