package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/clientrecord"
)

// loopFiles are the files of the directory the agents are asked to list. No
// request carries their names before the client has run its tool, so an answer
// that names them was made from the tool's output.
var loopFiles = []string{"parser.rs", "todo.yaml", "worker.sh"}

// loopTurnTimeout bounds a loop's turn: the trained model's eight layers prefill an
// agent's prompt (9k to 20k tokens) for minutes on a loaded CPU.
const loopTurnTimeout = 15 * time.Minute

// TestCodingAgentsToolLoop: Claude Code and Codex CLI, each asked headless for the files of a directory and served the trained
// test model, calls its shell tool, runs it, sends its output back, and prints an
// answer that names every file; with MACFLEET_AGENT_RESAMPLE set, the last request of
// each loop is asked again that many times (resampleLoop).
func TestCodingAgentsToolLoop(t *testing.T) {
	claude, codex := codingAgents(t)
	model := trainedDeployment(t, "coder", agentContextLength)
	claude.model, codex.model = model, model
	claude.turnTimeout, codex.turnTimeout = loopTurnTimeout, loopTurnTimeout
	proxy, proxyURL := recordingProxy(t)
	const prompt = "List the files in this directory."

	t.Run("claude-code", func(t *testing.T) {
		calls, out := listingTurn(t, claude, func(home, work string) ([]clientrecord.Exchange, string) {
			// -p refuses tools that ask for permission; ls is allowed here, nothing else.
			return runAgentTurn(t, proxy, claude, 1, work, claudeEnv(home, proxyURL, model),
				"-p", prompt, "--allowedTools", "Bash(ls:*)")
		})
		resampleLoop(t, claude, calls) // before the loop's own answer is checked: that check ends the test
		checkToolLoop(t, claude, calls, out)
	})
	t.Run("codex", func(t *testing.T) {
		calls, out := listingTurn(t, codex, func(home, work string) ([]clientrecord.Exchange, string) {
			return runAgentTurn(t, proxy, codex, 1, work, codexEnv(t, home, proxyURL, model),
				"exec", "--skip-git-repo-check", prompt)
		})
		resampleLoop(t, codex, calls) // before the loop's own answer is checked: that check ends the test
		checkToolLoop(t, codex, calls, out)
	})
}

// listingSamples bounds the turns listingTurn asks.
const listingSamples = 3

// listingTurn runs a turn (turn, in a fresh home and its loopDir) until its first
// tool call lists the directory, at most listingSamples times, and returns the last
// turn's requests and output. The clients send no temperature, so the model's first
// call is a sample at 1: the trained model called `cat Makefile` instead of ls in
// two full runs of the tests (docs/testing.md), a slip of the model, after which the
// client refuses the call and the loop has no listing to carry. A turn that calls
// nothing, or whose call lists, is returned as it is: checkToolLoop judges it.
func listingTurn(t *testing.T, c agentClient, turn func(home, work string) ([]clientrecord.Exchange, string)) ([]clientrecord.Exchange, string) {
	t.Helper()
	for sample := 1; ; sample++ {
		home := t.TempDir()
		calls, out := turn(home, loopDir(t, home))
		first := firstToolCall(calls)
		if first == "" || strings.Contains(first, `"ls`) || sample == listingSamples {
			return calls, out
		}
		t.Logf("%s sample %d: the model's first call %s lists nothing; asking the turn again", c.name, sample, first)
	}
}

// firstToolCall is the first tool call the answers to calls make ("" for none).
func firstToolCall(calls []clientrecord.Exchange) string {
	for _, x := range calls {
		if made := toolCallsOf(x.Response); len(made) > 0 {
			return made[0]
		}
	}
	return ""
}

// loopDir makes home/work holding loopFiles.
func loopDir(t *testing.T, home string) string {
	t.Helper()
	work := filepath.Join(home, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range loopFiles {
		if err := os.WriteFile(filepath.Join(work, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return work
}

// checkToolLoop: an answer called a tool, the request after it carries the tool's
// output (loopFiles, which no request named before), and the client printed an
// answer naming every file.
func checkToolLoop(t *testing.T, c agentClient, calls []clientrecord.Exchange, out string) {
	t.Helper()
	called := -1
	for i, x := range calls {
		var body struct {
			Tools []json.RawMessage `json:"tools"`
		}
		_ = json.Unmarshal(x.Body, &body)
		t.Logf("%s request %d: %d bytes, %d tools, answered %d", c.name, i+1, len(x.Body), len(body.Tools), x.Status)
		if made := toolCallsOf(x.Response); len(made) > 0 {
			t.Logf("%s answer %d called %s", c.name, i+1, strings.Join(made, ", "))
			if called < 0 {
				called = i
			}
		}
	}
	if called < 0 {
		t.Fatalf("%s: none of its %d requests was answered with a tool call", c.name, len(calls))
	}
	for i, x := range calls[:called+1] {
		if f := namedFile(x.Body); f != "" {
			t.Fatalf("%s request %d names %s before any tool ran: the loop would prove nothing", c.name, i+1, f)
		}
	}
	withResult := false
	for _, x := range calls[called+1:] {
		withResult = withResult || allFilesIn(x.Body)
	}
	if !withResult {
		t.Fatalf("%s: no request after the tool call carries the tool's output (%v)", c.name, loopFiles)
	}
	if !allFilesIn([]byte(out)) {
		t.Fatalf("%s's answer does not name every file of %v: %q", c.name, loopFiles, out)
	}
}

// toolCallsOf is the calls an answer's stream makes, each as name(arguments):
// Anthropic's tool_use blocks (arguments in input_json_delta events) or Responses'
// function_call items.
func toolCallsOf(stream []byte) []string {
	var calls []string
	open := -1 // the index in calls of the tool_use block being streamed
	for _, ev := range sseData(stream) {
		switch ev["type"] {
		case "content_block_start":
			block, _ := ev["content_block"].(map[string]any)
			open = -1
			if block["type"] == "tool_use" {
				name, _ := block["name"].(string)
				calls, open = append(calls, name+"("), len(calls)
			}
		case "content_block_delta":
			delta, _ := ev["delta"].(map[string]any)
			if part, ok := delta["partial_json"].(string); ok && open >= 0 {
				calls[open] += part
			}
		case "content_block_stop":
			if open >= 0 {
				calls[open] += ")"
			}
			open = -1
		case "response.output_item.done":
			item, _ := ev["item"].(map[string]any)
			if item["type"] == "function_call" {
				name, _ := item["name"].(string)
				args, _ := item["arguments"].(string)
				calls = append(calls, name+"("+args+")")
			}
		}
	}
	return calls
}

func namedFile(b []byte) string {
	for _, f := range loopFiles {
		if bytes.Contains(b, []byte(f)) {
			return f
		}
	}
	return ""
}

func allFilesIn(b []byte) bool {
	for _, f := range loopFiles {
		if !strings.Contains(string(b), f) {
			return false
		}
	}
	return true
}
