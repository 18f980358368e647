package gateway

import (
	"testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// TestStartingGatewayAnswers503: before its first table a gateway knows no
// deployment, which does not mean none exists: a request is a retryable 503
// gateway_starting with Retry-After, not a 404 a client would not retry (the soak
// found a restarted gateway answering 404 for served models). Once a table is set, an
// unknown model is a 404.
func TestStartingGatewayAnswers503(t *testing.T) {
	g := newTestGateway(t, Options{})
	resp, body := post(t, g.url, chatBody)
	if e := decodeErr(t, body); resp.StatusCode != 503 || e.Error.Code != codeStarting || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("before the first table: %d Retry-After %q %s, want 503 %s with Retry-After 1",
			resp.StatusCode, resp.Header.Get("Retry-After"), body, codeStarting)
	}
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("b", "other", "")}, nil, nil))
	resp, body = post(t, g.url, chatBody)
	if e := decodeErr(t, body); resp.StatusCode != 404 || e.Error.Code != codeModelNotFound {
		t.Errorf("with a table: %d %s, want 404 %s", resp.StatusCode, body, codeModelNotFound)
	}
}
