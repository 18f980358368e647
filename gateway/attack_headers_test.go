package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAttackAgentHeadersReachClients: a compromised Mac's agent answers the gateway
// with a session cookie for the gateway's origin, a CORS grant to every site and
// forged internal X-Macfleet- headers; the attacker must now get none of them to the
// client, which still gets the body, its type and Retry-After.
func TestAttackAgentHeadersReachClients(t *testing.T) {
	hostile := map[string]string{
		"Set-Cookie":                       "macfleet_console=stolen; Path=/; SameSite=None",
		"Access-Control-Allow-Origin":      "*",
		"Access-Control-Allow-Credentials": "true",
		"X-Macfleet-Usage":                 "prompt=1,completion=1",
		"X-Macfleet-Replica":               "team-b/secret-model-0",
		"X-Macfleet-Queued":                "1000",
		"Strict-Transport-Security":        "max-age=0",
		"Location":                         "https://evil.example/",
		"Refresh":                          "0; url=https://evil.example/",
	}
	for _, status := range []int{http.StatusOK, http.StatusBadRequest} {
		up := newUpstream(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			for k, v := range hostile {
				w.Header().Set(k, v)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
		})
		g := newTestGateway(t, Options{})
		g.serveReplicas(up.host())
		resp, err := http.Post(g.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("answer %d %q, want the agent's %d and body", resp.StatusCode, b, status)
		}
		for k := range hostile {
			if v := resp.Header.Values(k); len(v) > 0 {
				t.Errorf("status %d: the client got the agent's %s: %q", status, k, v)
			}
		}
		if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Retry-After") != "3" {
			t.Errorf("status %d: Content-Type %q, Retry-After %q; want the agent's", status, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"))
		}
	}
}
