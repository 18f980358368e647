package corpus

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// The parts of a coding agent's requests that the client writes itself as data,
// not prose: the recorded requests redact them like its instructions, but filled
// with generated prose they are not what the model meets. The trained model that
// had only seen prose there answered Codex CLI's real first request with
// exec_command({"filename": "build"}), and its real tool result with an answer
// about another question (docs/testing.md).

// environmentPaths are the working directories an agent may run in: {n} a number,
// {d} a digit, {p} a project, {u} a user.
var environmentPaths = []string{"/tmp/TestCodingAgentsToolLoop{n}/00{d}/work", "/home/user/projects/{p}",
	"/Users/{u}/src/{p}", "/work/{p}", "/tmp/{p}-{n}", "/srv/{p}/checkout{d}"}

var projects = []string{"api", "webapp", "cli", "notes", "server", "tools", "site", "infra", "parser", "demo"}

var shells = []string{"bash", "bash", "zsh", "sh"}

var timezones = []string{"Etc/UTC", "Etc/UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "America/Sao_Paulo",
	"Australia/Sydney", "Africa/Lagos"}

// codexEnvironment is the environment context Codex CLI sends as a user message
// before the prompt: its working directory, shell, date, time zone and the
// read-only sandbox it runs in.
func codexEnvironment(r *rand.Rand) string {
	cwd := strings.NewReplacer("{n}", strconv.Itoa(1000000+r.IntN(9000000)), "{d}", strconv.Itoa(1+r.IntN(9)),
		"{p}", pick(r, projects), "{u}", strings.ToLower(pick(r, people))).Replace(pick(r, environmentPaths))
	var b strings.Builder
	b.WriteString("<environment_context>\n")
	fmt.Fprintf(&b, "  <cwd>%s</cwd>\n  <shell>%s</shell>\n", cwd, pick(r, shells))
	fmt.Fprintf(&b, "  <current_date>%d-%02d-%02d</current_date>\n", 2025+r.IntN(3), 1+r.IntN(12), 1+r.IntN(28))
	fmt.Fprintf(&b, "  <timezone>%s</timezone>\n", pick(r, timezones))
	fmt.Fprintf(&b, `  <filesystem><workspace_roots><root>%s</root></workspace_roots><permission_profile type="managed">`+
		`<file_system type="restricted"><entry access="read"><special>:root</special></entry></file_system>`+
		"</permission_profile></filesystem>\n", cwd)
	b.WriteString("</environment_context>")
	return b.String()
}

// agentContext is what a client writes around the prompt: user messages before
// the prompt's (before), or text parts before the prompt in its own message
// (inPrompt).
type agentContext struct {
	before, inPrompt func(r *rand.Rand) string
}

// agentContexts are, per client (the fixture name's first word), the contexts it
// writes.
var agentContexts = map[string]agentContext{"codex": {before: codexEnvironment}, "claude": {inPrompt: claudeReminder}}

// setContext puts the client's generated context into the user messages of body
// before the last (the prompt's), and into the text parts of the last before its
// last part (the prompt), for the clients agentContexts knows.
func setContext(r *rand.Rand, client string, body map[string]any) {
	context := agentContexts[client]
	list, _ := body["input"].([]any)
	if list == nil {
		list, _ = body["messages"].([]any)
	}
	last := -1
	for i, m := range list {
		if m, _ := m.(map[string]any); m != nil && m["role"] == "user" {
			last = i
		}
	}
	if last < 0 {
		return
	}
	for _, m := range list[:last] {
		if m, _ := m.(map[string]any); context.before != nil && m != nil && m["role"] == "user" {
			setTexts(r, m, context.before, false)
		}
	}
	if context.inPrompt != nil {
		setTexts(r, list[last].(map[string]any), context.inPrompt, true)
	}
}

// setTexts replaces the text of message m, or of each of its text parts, with
// text(r); with butLast, every text part but the last, and a message of one text
// is left alone.
func setTexts(r *rand.Rand, m map[string]any, text func(r *rand.Rand) string, butLast bool) {
	parts, _ := m["content"].([]any)
	if parts == nil {
		if !butLast {
			m["content"] = text(r)
		}
		return
	}
	var texts []map[string]any
	for _, p := range parts {
		if p, _ := p.(map[string]any); p != nil && p["text"] != nil {
			texts = append(texts, p)
		}
	}
	if butLast && len(texts) > 0 {
		texts = texts[:len(texts)-1]
	}
	for _, p := range texts {
		p["text"] = text(r)
	}
}

// toolOutputs give, per shell tool, the tool result its client sends for a
// command's output.
var toolOutputs = map[string]func(r *rand.Rand, output string) string{"exec_command": execOutput}

// execOutput is the result Codex CLI sends for a command that exec_command ran:
// a header of the run, then the output.
func execOutput(r *rand.Rand, output string) string {
	output += "\n"
	return fmt.Sprintf("Chunk ID: %06x\nWall time: %.4f seconds\nProcess exited with code 0\nOriginal token count: %d\nOutput:\n%s",
		r.IntN(1<<24), r.Float64()*0.05, (len(output)+3)/4, output)
}

// commandOutput is the output of a command in a tool result of tool.
func commandOutput(r *rand.Rand, tool, output string) string {
	if f := toolOutputs[tool]; f != nil {
		return f(r, output)
	}
	return output
}
