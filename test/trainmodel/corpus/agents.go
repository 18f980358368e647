package corpus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/translate"
)

// AgentFixtures is where the coding agents' recorded requests are, from the
// repository root (internal/chat/translate/testdata/clients/README.md).
const AgentFixtures = "internal/chat/translate/testdata/clients"

// agentRequest is a coding agent's first request, recorded: what its client sends
// to the gateway before the translator makes a chat request of it.
type agentRequest struct {
	name string
	path string
	body any
}

// loadAgents reads the turn-1 requests of every recorded client version in dir.
func loadAgents(dir string) ([]agentRequest, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*-turn1.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no recorded coding agent requests (*-turn1.json) in %s", dir)
	}
	slices.Sort(files)
	var out []agentRequest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var fx struct {
			Path string          `json:"path"`
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(b, &fx); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", f, err)
		}
		dec := json.NewDecoder(bytes.NewReader(fx.Body))
		dec.UseNumber()
		var body any
		if err := dec.Decode(&body); err != nil {
			return nil, fmt.Errorf("parsing the body of %s: %w", f, err)
		}
		out = append(out, agentRequest{name: strings.TrimSuffix(filepath.Base(f), "-turn1.json"), path: fx.Path, body: body})
	}
	return out, nil
}

var redacted = regexp.MustCompile(`^<redacted (\d+) chars>$`)

// fill replaces every redacted string of v with prose of about scale times its
// length, and returns the copy.
func fill(r *rand.Rand, v any, scale float64) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // map order must not reach the generator
		for _, k := range keys {
			out[k] = fill(r, x[k], scale)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = fill(r, e, scale)
		}
		return out
	case string:
		if m := redacted.FindStringSubmatch(x); m != nil {
			n, _ := strconv.Atoi(m[1])
			return filler(r, max(4, int(float64(n)*scale)))
		}
	}
	return v
}

// setPrompt puts prompt in the last text part of the last user message of a
// Messages (messages) or Responses (input) body.
func setPrompt(body map[string]any, prompt string) error {
	list, _ := body["messages"].([]any)
	if list == nil {
		list, _ = body["input"].([]any)
	}
	for i := len(list) - 1; i >= 0; i-- {
		m, _ := list[i].(map[string]any)
		if m == nil || m["role"] != "user" {
			continue
		}
		parts, _ := m["content"].([]any)
		for j := len(parts) - 1; j >= 0; j-- {
			if p, _ := parts[j].(map[string]any); p != nil && p["text"] != nil {
				p["text"] = prompt
				return nil
			}
		}
		m["content"] = prompt
		return nil
	}
	return fmt.Errorf("no user message to put the prompt in")
}

// chatRequest is the chat request the gateway's translator makes of body.
func chatRequest(path string, body any) (*runnerapi.ChatRequest, error) {
	var captured []byte
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		captured, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusServiceUnavailable) // the answer does not matter
	})
	var h http.Handler
	switch p, _, _ := strings.Cut(path, "?"); p {
	case "/v1/messages":
		h = translate.Anthropic(inner)
	case "/v1/responses":
		h = translate.Responses(inner)
	default:
		return nil, fmt.Errorf("a recorded request to %s, which no translator serves", path)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(b)))
	if captured == nil {
		return nil, fmt.Errorf("the translator refused the request: %d %s", w.Code, w.Body)
	}
	var req runnerapi.ChatRequest
	if err := json.Unmarshal(captured, &req); err != nil {
		return nil, fmt.Errorf("decoding the translated request: %w", err)
	}
	return &req, nil
}

// shellTool finds the agent's tool that runs a command and its command parameter.
func shellTool(tools []runnerapi.Tool) (name, param string, array bool, ok bool) {
	for _, t := range tools {
		switch t.Function.Name {
		case "Bash", "bash", "shell", "exec_command", "run_shell_command", "execute_command":
		default:
			continue
		}
		var s struct {
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		}
		_ = json.Unmarshal(t.Function.Parameters, &s)
		for _, p := range []string{"command", "cmd"} {
			if prop, has := s.Properties[p]; has {
				return t.Function.Name, p, prop.Type == "array", true
			}
		}
	}
	return "", "", false, false
}

var listPrompts = []string{"List the files in this directory.", "list the files", "What files are in the current directory?",
	"Show me the files here.", "ls", "Which files are in this folder?", "List the files.", "What's in this directory?",
	"List all files in the current directory and tell me what they are."}

// agentTurn is a coding agent's request that needs a file listing (or, in a few, a
// file's contents or no tool at all), answered with a call of its shell tool, the
// tool's output, and an answer from it.
func agentTurn(r *rand.Rand, agents []agentRequest) (Conversation, error) {
	a := pick(r, agents)
	var prompt, command, result, ans string
	kind := r.IntN(10)
	switch {
	case kind < 6:
		prompt, command = pick(r, listPrompts), "ls"
		if chance(r, 0.25) {
			d := pick(r, dirs[1:])
			prompt, command = fmt.Sprintf("List the files in %s.", d), "ls "+d
		}
		files := fileList(r, 2+r.IntN(6))
		result = strings.Join(files, "\n")
		list := and(files)
		ans = pick(r, []string{"The directory contains " + list + ".", "Here are the files: " + list + ".",
			fmt.Sprintf("There are %d files: %s.", len(files), list)})
	case kind < 8:
		f := fileName(r)
		prompt, command = fmt.Sprintf(pick(r, []string{"Read %s and tell me what it says.", "What is in %s?", "Show me %s."}), f), "cat "+f
		result = filler(r, 40+r.IntN(80))
		ans = fmt.Sprintf("%s says: %s", f, result)
	default:
		q := question(r)
		prompt, ans = q.q, q.a
	}
	body, _ := fill(r, a.body, 0.3+1.1*r.Float64()).(map[string]any)
	client, _, _ := strings.Cut(a.name, "-")
	setContext(r, client, body)
	if err := setPrompt(body, prompt); err != nil {
		return Conversation{}, fmt.Errorf("%s: %w", a.name, err)
	}
	req, err := chatRequest(a.path, body)
	if err != nil {
		return Conversation{}, fmt.Errorf("%s: %w", a.name, err)
	}
	c := Conversation{Kind: "agent-" + client, Tools: req.Tools, Messages: req.Messages}
	if req.ToolChoice != nil && req.ToolChoice.Mode == "none" {
		c.Tools = nil
	}
	tool, p, array, ok := shellTool(req.Tools)
	if command == "" || !ok {
		c.Messages = append(c.Messages, msg("assistant", ans))
		return c, nil
	}
	var arg any = command
	if array {
		arg = strings.Fields(command)
	}
	args, _ := json.Marshal(map[string]any{p: arg})
	id := callID(r)
	c.Messages = append(c.Messages,
		runnerapi.Message{Role: "assistant", ToolCalls: []runnerapi.ToolCall{{ID: id, Type: "function",
			Function: runnerapi.FunctionCall{Name: tool, Arguments: string(args)}}}},
		runnerapi.Message{Role: "tool", Content: runnerapi.MessageContent(commandOutput(r, tool, result)), ToolCallID: id},
		msg("assistant", ans))
	return c, nil
}
