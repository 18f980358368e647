package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
)

// TestCancelEndsTheAnswerWithItsUsage: a gateway that names its request
// (runnerapi.HeaderRequestID) and then asks POST /api/requests/cancel to end it gets the rest
// of the stream up to [DONE] and, as for any answer, the runner's usage of it as the
// metering.Header trailer: the tokens generated until the cancel, fewer than asked
// for. A request the agent does not have answers found false; no id is a 400.
func TestCancelEndsTheAnswerWithItsUsage(t *testing.T) {
	const maxTokens = 500
	a := startAgent(t, agentOptions{})
	body := chatBody("tiny", maxTokens, true)
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(runnerapi.HeaderRequestID, "gw-req-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	contents := 0
	for contents < 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before the cancel: %v", err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			contents++
		}
	}
	cancel := func(id string) runnerapi.Cancelled {
		t.Helper()
		r, rb := a.do(http.MethodPost, "/api/requests/cancel", runnerapi.Cancel{ID: id})
		var out runnerapi.Cancelled
		if r.StatusCode != http.StatusOK || json.Unmarshal(rb, &out) != nil {
			t.Fatalf("cancel %q: %d %s", id, r.StatusCode, rb)
		}
		return out
	}
	if !cancel("gw-req-1").Found {
		t.Fatal("the agent did not find the request in progress")
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `"finish_reason":"cancelled"`) {
		t.Fatalf("the cancelled stream ended with %q; want a cancelled finish and [DONE]", rest)
	}
	if strings.Contains(string(rest), `"usage":`) {
		t.Errorf("the client did not ask for usage but got it: %q", rest)
	}
	u, err := metering.Parse(resp.Trailer.Get(metering.Header))
	if err != nil {
		t.Fatalf("trailer %q: %v", resp.Trailer.Get(metering.Header), err)
	}
	if u.Input == 0 || u.Output < int64(contents) || u.Output >= maxTokens {
		t.Errorf("usage %+v after %d content chunks: want the prompt and between %d and %d output tokens",
			u, contents, contents, maxTokens-1)
	}
	if cancel("gw-req-1").Found || cancel("never-sent").Found {
		t.Error("a request the agent does not have was found")
	}
	if r, rb := a.do(http.MethodPost, "/api/requests/cancel", runnerapi.Cancel{}); r.StatusCode != http.StatusBadRequest {
		t.Errorf("cancel without an id: %d %s, want 400", r.StatusCode, rb)
	}
}
