package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/clientrecord"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The coding agents' requests carry a system prompt and tools of 9k to 20k tokens:
// the deployment they use has room for that and an answer.
const (
	agentContextLength = testassets.CoderContextLength
	// agentMaxOutputTokens bounds every answer, should agentModel's steering break
	// (random weights never end one).
	agentMaxOutputTokens = 64
	// agentTurnTimeout bounds one client process (one turn).
	agentTurnTimeout = 6 * time.Minute
	// recordEnv set rewrites internal/chat/translate/testdata/clients from this run
	// (make record-clients), for the client versions installed.
	recordEnv = "MACFLEET_E2E_RECORD"
)

// agentModel writes testassets.CoderSpec's model (steered to answer "Hi" and end its
// turn) where the fleet's model server serves it.
var agentModel = sync.OnceValue(func() error {
	spec, err := testassets.CoderSpec()
	if err != nil {
		return err
	}
	return ggufsynth.Write(filepath.Join(fleet.ModelsDir, "llama31-hi.gguf"), spec)
})

// agentClient is one coding agent from hack/npm's lockfile.
type agentClient struct {
	// name is the npm package's unscoped name (claude-code, codex): fixtures are
	// named <name>-<version>-turn<N>.json.
	name, version string
	bin           string
	// apiPath is the path of the API it calls.
	apiPath string
	// model is the deployment it uses, namespace/name.
	model string
	// turnTimeout bounds one turn; 0 is agentTurnTimeout.
	turnTimeout time.Duration
}

// codingAgents finds Claude Code and Codex CLI where hack/deps.sh installs
// hack/npm's lockfile ($MACFLEET_NODE_MODULES, default ~/.cache/macfleet/npm/node_modules)
// and checks they are the pinned versions. Without them the test is skipped, except
// in CI.
func codingAgents(t *testing.T) (claude, codex agentClient) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "hack", "npm", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct{ Dependencies map[string]string }
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatalf("hack/npm/package.json: %v", err)
	}
	modules := nodeModules()
	claude = agentClient{name: "claude-code", version: clientVersion(modules, "@anthropic-ai/claude-code", pkg.Dependencies),
		bin: filepath.Join(modules, ".bin", "claude"), apiPath: "/v1/messages"}
	codex = agentClient{name: "codex", version: clientVersion(modules, "@openai/codex", pkg.Dependencies),
		bin: filepath.Join(modules, ".bin", "codex"), apiPath: "/v1/responses"}
	for _, c := range []agentClient{claude, codex} {
		if c.version == "" {
			t.Fatalf("hack/npm/package.json pins no version of %s", c.name)
		}
		if _, err := os.Stat(c.bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (%v); hack/deps.sh installs hack/npm's lockfile", c.name, err)
			}
			t.Skipf("%s is not installed in %s; hack/deps.sh installs hack/npm's lockfile", c.name, modules)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		out, err := exec.CommandContext(ctx, c.bin, "--version").CombinedOutput()
		cancel()
		if err != nil || !strings.Contains(string(out), c.version) {
			t.Fatalf("%s --version: %v %q, want %s (hack/npm/package.json): reinstall the lockfile", c.bin, err, out, c.version)
		}
	}
	return claude, codex
}

// clientVersion is the version of the client package pkg the test expects: the one
// hack/npm pins, or when recording (make record-clients) the one installed in
// modules, so a newer client's fixtures are written beside the pinned one's.
func clientVersion(modules, pkg string, pinned map[string]string) string {
	if os.Getenv(recordEnv) == "" {
		return pinned[pkg]
	}
	var installed struct{ Version string }
	b, err := os.ReadFile(filepath.Join(modules, filepath.FromSlash(pkg), "package.json"))
	if err != nil || json.Unmarshal(b, &installed) != nil || installed.Version == "" {
		return pinned[pkg]
	}
	return installed.Version
}

// claudeEnv is the environment that points Claude Code at baseURL (the gateway) and
// keeps it from reaching anything else: without CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC
// it looks up api.anthropic.com; the other three are what that one implies, spelled
// out. It reads and writes only under home.
func claudeEnv(home, baseURL, model string) []string {
	return []string{
		"HOME=" + home, "PATH=" + os.Getenv("PATH"),
		"ANTHROPIC_BASE_URL=" + baseURL,
		// The local fleet has no API keys.
		"ANTHROPIC_API_KEY=unused",
		// Background tasks use the haiku model.
		"ANTHROPIC_MODEL=" + model, "ANTHROPIC_DEFAULT_HAIKU_MODEL=" + model,
		fmt.Sprintf("CLAUDE_CODE_MAX_OUTPUT_TOKENS=%d", agentMaxOutputTokens),
		// Else newer versions assume a far longer context than the deployment's.
		fmt.Sprintf("CLAUDE_CODE_MAX_CONTEXT_TOKENS=%d", agentContextLength),
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1",
	}
}

// codexConfig is Codex CLI's config.toml for the gateway at baseURL. Without
// features.plugins = false it fetches a plugin catalogue from github.com and
// chatgpt.com at start, without analytics.enabled = false it reports to
// ab.chatgpt.com. Codex has no setting for the answer's length (the test's proxy adds
// max_output_tokens).
func codexConfig(baseURL, model string) string {
	return fmt.Sprintf(`model = %q
model_provider = "macfleet"
model_context_window = %d
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.macfleet]
name = "macfleet"
base_url = %q
wire_api = "responses"
env_key = "MACFLEET_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false

[analytics]
enabled = false
`, model, agentContextLength, baseURL+"/v1")
}

// TestCodingAgents runs Claude Code and Codex CLI headless against the gateway, through
// a recording proxy: each answers a first turn and a resumed second turn without an API
// error, and the second turn restores the 9k- to 12k-token prefix of the first from the
// prompt cache instead of prefilling it again.
func TestCodingAgents(t *testing.T) {
	claude, codex := codingAgents(t)
	model := coderDeployment(t)
	claude.model, codex.model = model, model

	proxy, proxyURL := recordingProxy(t)

	t.Run("claude-code", func(t *testing.T) {
		home := t.TempDir()
		env := claudeEnv(home, proxyURL, model)
		turn1, _ := runAgentTurn(t, proxy, claude, 1, home, env, "-p", "Say hi")
		turn2, _ := runAgentTurn(t, proxy, claude, 2, home, env, "-p", "--continue", "Say hi again")
		checkCacheHit(t, claude, turn1, turn2)
	})
	t.Run("codex", func(t *testing.T) {
		home := t.TempDir()
		work := filepath.Join(home, "work")
		if err := os.Mkdir(work, 0o700); err != nil {
			t.Fatal(err)
		}
		env := codexEnv(t, home, proxyURL, model)
		turn1, _ := runAgentTurn(t, proxy, codex, 1, work, env, "exec", "--skip-git-repo-check", "Say hi")
		turn2, _ := runAgentTurn(t, proxy, codex, 2, work, env, "exec", "--skip-git-repo-check", "resume", "--last", "Say hi again")
		checkCacheHit(t, codex, turn1, turn2)
	})
}

// coderDeployment deploys agentModel as "coder" in a namespace of the test's own, one
// replica (a second turn must find the first turn's prefix on it), and returns its
// name, namespace/name, once it is Ready.
func coderDeployment(t *testing.T) string {
	t.Helper()
	if err := agentModel(); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "coder", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/llama31-hi.gguf"
		md.Spec.Engine.ContextLength = agentContextLength
	}))
	waitReady(t, ns, "coder", 1, 3*time.Minute)
	return ns + "/coder"
}

// recordingProxy starts the recording proxy in front of the gateway that the agents
// call, and returns it and its URL.
func recordingProxy(t *testing.T) (*clientrecord.Proxy, string) {
	t.Helper()
	proxy, err := clientrecord.New(fleet.GatewayURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Adjust = boundResponses
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return proxy, srv.URL
}

// codexEnv writes Codex CLI's config for the gateway at baseURL under home/codex and
// returns the environment that runs Codex with it.
func codexEnv(t *testing.T, home, baseURL, model string) []string {
	t.Helper()
	codexHome := filepath.Join(home, "codex")
	if err := os.Mkdir(codexHome, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(codexConfig(baseURL, model)), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "CODEX_HOME=" + codexHome, "MACFLEET_API_KEY=unused"}
}

// boundResponses adds max_output_tokens to a Responses request without one. Codex has
// no setting for it; agentModel ends its answers after one token, and should that
// break, a bounded answer fails the turn at once ("Incomplete response") where an
// unbounded one would run until the context is full.
func boundResponses(path string, body []byte) []byte {
	if path != "/v1/responses" {
		return body
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil || req["max_output_tokens"] != nil {
		return body
	}
	req["max_output_tokens"] = json.RawMessage(fmt.Sprint(agentMaxOutputTokens))
	out, err := json.Marshal(req)
	if err != nil {
		return body
	}
	return out
}

// apiErrorInOutput matches what the clients print when the API refuses a request
// (Claude Code: "API Error: 400 …"; Codex: "ERROR: unexpected status 400 …").
var apiErrorInOutput = regexp.MustCompile(`(?i)api error|^error:|unexpected status`)

// runAgentTurn runs one client process in dir and returns the API requests it sent
// and what it printed.
// It fails the test when the process fails, prints an API error, or any of its API
// requests was not answered 200 with a complete answer. With $MACFLEET_E2E_RECORD set
// the turn's first API request is written as a fixture first, whatever happens next.
func runAgentTurn(t *testing.T, proxy *clientrecord.Proxy, c agentClient, turn int, dir string, env []string, args ...string) ([]clientrecord.Exchange, string) {
	t.Helper()
	proxy.Reset()
	timeout := cmp.Or(c.turnTimeout, agentTurnTimeout)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	bin, argv, trace := traceNetwork(t, c.bin, args)
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Dir, cmd.Env = dir, env
	// The clients start helpers (Codex its sandbox, Claude Code shells): a timeout kills
	// the whole process group, and Wait gives up on pipes they hold after WaitDelay.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(start)
	t.Logf("%s turn %d (%s %s) took %v:\n%s", c.name, turn, filepath.Base(c.bin), strings.Join(args, " "),
		elapsed.Round(time.Millisecond), out)

	checkNetwork(t, fmt.Sprintf("%s turn %d", c.name, turn), trace)
	var calls []clientrecord.Exchange
	for _, x := range proxy.Exchanges() {
		if x.Method == "POST" && strings.SplitN(x.Path, "?", 2)[0] == c.apiPath {
			calls = append(calls, x)
		}
	}
	if len(calls) > 0 && os.Getenv(recordEnv) != "" {
		writeFixture(t, fmt.Sprintf("%s-%s-turn%d.json", c.name, c.version, turn), c.model, calls[0])
	}
	for i, x := range calls {
		status := fmt.Sprintf("%s request %d of turn %d: %s %s answered %d", c.name, i+1, turn, x.Method, x.Path, x.Status)
		if x.Status != 200 || !x.Done || streamError(x.Response) != "" {
			t.Errorf("%s (done %v): %s%s", status, x.Done, clip(x.Response, 2000), streamError(x.Response))
		} else {
			t.Log(status)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("%s turn %d did not finish within %v", c.name, turn, timeout)
	}
	if err != nil {
		t.Fatalf("%s turn %d failed: %v", c.name, turn, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if apiErrorInOutput.MatchString(strings.TrimSpace(line)) {
			t.Fatalf("%s turn %d printed an API error: %s", c.name, turn, line)
		}
	}
	if len(calls) == 0 {
		t.Fatalf("%s turn %d sent no request to %s", c.name, turn, c.apiPath)
	}
	return calls, string(out)
}

// fixtureModel replaces the deployment's name, which changes every run, in fixtures.
const fixtureModel = "agents/coder"

// writeFixture writes a recorded request, redacted, to internal/chat/translate/testdata/clients,
// with fixtureModel for model.
func writeFixture(t *testing.T, name, model string, x clientrecord.Exchange) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := clientrecord.Fixture(x)
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	b = bytes.ReplaceAll(b, []byte(model), []byte(fixtureModel))
	path := filepath.Join(root, "internal", "chat", "translate", "testdata", "clients", name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("Recorded %s", path)
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// sseData returns the JSON payloads of an SSE stream's data lines, in order.
func sseData(stream []byte) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(make([]byte, 0, 64<<10), clientrecord.MaxBodyBytes)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		var v map[string]any
		if ok && json.Unmarshal([]byte(strings.TrimSpace(data)), &v) == nil {
			out = append(out, v)
		}
	}
	return out
}

// streamError is the error an answer reports in its stream, or "".
func streamError(stream []byte) string {
	for _, ev := range sseData(stream) {
		switch ev["type"] {
		case "error", "response.failed", "response.incomplete":
			b, _ := json.Marshal(ev)
			return " (stream: " + string(b) + ")"
		}
	}
	return ""
}

// promptUsage is what an answer reports of its prompt: tokens in all and tokens
// restored from the prompt cache. Anthropic counts cache reads apart from
// input_tokens (message_start, message_delta); Responses counts them within
// input_tokens (response.completed). atStart is Anthropic's count in message_start,
// which Claude Code reads to manage its context.
type promptUsage struct{ prompt, cached, atStart int }

func usageOf(stream []byte) promptUsage {
	var u promptUsage
	num := func(m map[string]any, k string) int {
		f, _ := m[k].(float64)
		return int(f)
	}
	for _, ev := range sseData(stream) {
		var m map[string]any
		switch ev["type"] {
		case "message_start":
			msg, _ := ev["message"].(map[string]any)
			m, _ = msg["usage"].(map[string]any)
		case "message_delta":
			m, _ = ev["usage"].(map[string]any)
		case "response.completed":
			resp, _ := ev["response"].(map[string]any)
			if ru, _ := resp["usage"].(map[string]any); ru != nil {
				details, _ := ru["input_tokens_details"].(map[string]any)
				u = promptUsage{prompt: num(ru, "input_tokens"), cached: num(details, "cached_tokens")}
			}
			continue
		}
		if m == nil {
			continue
		}
		cached := num(m, "cache_read_input_tokens")
		prompt := num(m, "input_tokens") + cached + num(m, "cache_creation_input_tokens")
		u.prompt, u.cached = max(u.prompt, prompt), max(u.cached, cached)
		if ev["type"] == "message_start" {
			u.atStart = prompt
		}
	}
	return u
}

// checkCacheHit: the resumed turn's prompt starts with the whole prompt of the first
// turn (system prompt, tools, first exchange), which the replica still holds, so at
// least that much of it comes from the prompt cache.
func checkCacheHit(t *testing.T, c agentClient, turn1, turn2 []clientrecord.Exchange) {
	t.Helper()
	u1, u2 := usageOf(turn1[0].Response), usageOf(turn2[0].Response)
	t.Logf("%s prompt tokens: turn 1 %d (%d cached), turn 2 %d (%d cached)", c.name, u1.prompt, u1.cached, u2.prompt, u2.cached)
	if u1.prompt < 1000 {
		t.Errorf("%s turn 1 reports a prompt of %d tokens; its system prompt and tools alone are thousands", c.name, u1.prompt)
	}
	if c.apiPath == "/v1/messages" && u1.atStart != u1.prompt {
		t.Errorf("%s turn 1: message_start reports a prompt of %d tokens, the end of the answer %d", c.name, u1.atStart, u1.prompt)
	}
	// The first turn's prompt ends with the template's assistant header, which the
	// second renders differently (the answer follows it): a few tokens may be
	// prefilled again.
	if u2.cached < u1.prompt*9/10 {
		t.Errorf("%s turn 2 restored %d of its %d prompt tokens from the cache, want at least 90%% of turn 1's %d: the prefix was prefilled again",
			c.name, u2.cached, u2.prompt, u1.prompt)
	}
}
