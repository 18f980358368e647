package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/clientrecord"
)

// resampleEnv, set to n, makes TestCodingAgentsToolLoop ask each client's last
// request of its loop (the one that carries the tool's output) n times more, as the
// client sent it, and fail where fewer than resampleShare of the answers name every
// file. The clients send no temperature, so they are answered at 1: one answer is one
// sample, and a model that names every file nine times in ten passes one run of the
// test nine times in ten. This is how a retrained test model is judged before it is
// adopted (docs/testing.md, "How it was chosen"); unset or 0, the
// loop's own answer is the whole check.
const resampleEnv = "MACFLEET_AGENT_RESAMPLE"

// resampleShare is the share of resampled answers that must name every file: the
// model in the repository named them in 78 of 80 of Claude Code's and 79 of 80 of
// Codex CLI's; the first candidate dropped, in 37 of 40 and 29 of 40.
const resampleShare = 0.9

// resampleLoop asks calls' last request again as resampleEnv says (nothing when it is
// unset) and checks the share of answers that name every file.
func resampleLoop(t *testing.T, c agentClient, calls []clientrecord.Exchange) {
	t.Helper()
	v := os.Getenv(resampleEnv)
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count of answers (0: none)", resampleEnv, v)
	}
	if n == 0 {
		return
	}
	if len(calls) < 2 {
		t.Logf("%s: %d requests, no loop to ask again (checkToolLoop says why)", c.name, len(calls))
		return
	}
	last := calls[len(calls)-1]
	named, misses := 0, map[string]int{}
	client := &http.Client{Timeout: 5 * time.Minute}
	for range n {
		text, err := askAgain(client, last)
		if err != nil {
			t.Fatalf("%s's last request asked again: %v", c.name, err)
		}
		if allFilesIn([]byte(text)) {
			named++
		} else {
			misses[text]++
		}
	}
	t.Logf("%s's last request asked %d times more: %d answers name every file of %v; the others: %v",
		c.name, n, named, loopFiles, misses)
	if float64(named) < resampleShare*float64(n) {
		t.Errorf("%s: %d of %d answers name every file, want %.0f %%", c.name, named, n, 100*resampleShare)
	}
}

// askAgain sends x's request to the gateway as the client sent it and returns its
// answer's text (an Anthropic or a Responses stream).
func askAgain(client *http.Client, x clientrecord.Exchange) (string, error) {
	req, err := http.NewRequest(x.Method, fleet.GatewayURL+x.Path, bytes.NewReader(x.Body))
	if err != nil {
		return "", err
	}
	for k, v := range x.Header {
		if k != "content-length" && k != "host" && k != "accept-encoding" {
			req.Header.Set(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("answered %d: %s", resp.StatusCode, body)
	}
	var text strings.Builder
	for _, ev := range sseData(body) {
		switch ev["type"] {
		case "content_block_delta":
			if d, _ := ev["delta"].(map[string]any); d["type"] == "text_delta" {
				s, _ := d["text"].(string)
				text.WriteString(s)
			}
		case "response.output_text.delta":
			s, _ := ev["delta"].(string)
			text.WriteString(s)
		}
	}
	if e := streamError(body); e != "" {
		return text.String(), fmt.Errorf("the answer failed%s", e)
	}
	return text.String(), nil
}
