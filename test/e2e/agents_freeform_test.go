package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/internal/chat/lark"
)

// freeformPatch is a patch written for this test in the shape a file-editing tool's
// grammar describes: one file added with two lines.
const freeformPatch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n+world\n*** End Patch\n"

// TestCodexFreeformApplyPatch: Codex CLI, told by a model catalog of its own
// (model_catalog_json) that the fleet's model takes apply_patch as a freeform tool,
// sends it as a custom tool with its Lark grammar (the shape that servers refusing
// custom tools answer with a 400, and many drop); the gateway takes the turn and
// answers it, and the grammar Codex sent parses here and matches a patch. The trained
// test model cannot write a whole patch under that grammar (its file name runs to a
// newline the model never writes), so the call itself is covered by
// internal/chat/translate's TestCustomToolOnARealRunner, on a grammar of the same
// shape with bounded lines.
func TestCodexFreeformApplyPatch(t *testing.T) {
	_, codex := codingAgents(t)
	codex.model = coderDeployment(t)
	proxy, proxyURL := recordingProxy(t)

	home := t.TempDir()
	work := filepath.Join(home, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	env := codexEnv(t, home, proxyURL, codex.model)
	catalog := filepath.Join(home, "codex", "models.json")
	if err := os.WriteFile(catalog, codexCatalog(t, codex.model), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(home, "codex", "config.toml")
	cfg, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	// A top-level key: before the first table of the file.
	cfg = append([]byte("model_catalog_json = "+tomlString(catalog)+"\n"), cfg...)
	if err := os.WriteFile(config, cfg, 0o600); err != nil {
		t.Fatal(err)
	}

	calls, _ := runAgentTurn(t, proxy, codex, 1, work, env, "exec", "--skip-git-repo-check", "Say hi")
	var body struct {
		Tools []struct {
			Type, Name string
			Format     struct{ Type, Syntax, Definition string }
		}
	}
	if err := json.Unmarshal(calls[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tool := range body.Tools {
		if tool.Type != "custom" || tool.Name != "apply_patch" {
			continue
		}
		found = true
		if tool.Format.Type != "grammar" || tool.Format.Syntax != "lark" {
			t.Fatalf("Codex's apply_patch has the format %+v, want a Lark grammar", tool.Format)
		}
		g, err := lark.Parse(tool.Format.Syntax, tool.Format.Definition)
		if err != nil {
			t.Fatalf("Codex's apply_patch grammar: %v\n%s", err, tool.Format.Definition)
		}
		if !g.Match(freeformPatch) {
			t.Errorf("Codex's apply_patch grammar does not match a patch that adds a file:\n%s", tool.Format.Definition)
		}
	}
	if !found {
		t.Fatalf("Codex sent no custom apply_patch tool with its model catalog; its tools: %+v", body.Tools)
	}
}

// codexCatalog is a model catalog for Codex CLI (its model_catalog_json) naming model
// with apply_patch as a freeform tool: the fields its parser requires, with neutral
// values, and short instructions of this test's own.
func codexCatalog(t *testing.T, model string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"models": []any{map[string]any{
		"slug": model, "display_name": model, "description": "the local fleet's model",
		"apply_patch_tool_type": "freeform", "shell_type": "shell_command",
		"context_window": agentContextLength, "supported_reasoning_levels": []any{},
		"visibility": "list", "supported_in_api": true, "priority": 1, "support_verbosity": false,
		"truncation_policy":            map[string]any{"mode": "tokens", "limit": 10000},
		"experimental_supported_tools": []any{},
		"base_instructions":            "You are a coding agent. Edit files with the apply_patch tool.",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tomlString is s as a TOML basic string.
func tomlString(s string) string {
	b, _ := json.Marshal(s) // a JSON string of a path is a valid TOML basic string
	return string(b)
}
