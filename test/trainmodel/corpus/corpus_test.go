package corpus

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

var (
	genOnce sync.Once
	gen     *Generator
	genErr  error
)

func generator(t *testing.T) *Generator {
	t.Helper()
	genOnce.Do(func() {
		var l *Llama3
		if l, genErr = LoadLlama3(); genErr == nil {
			if gen, genErr = NewGenerator(l, 7, filepath.Join("..", "..", "..", AgentFixtures)); genErr == nil {
				gen.quoteEvery = 10
			}
		}
	})
	if genErr != nil {
		t.Fatal(genErr)
	}
	return gen
}

// TestDocuments checks the first documents of a corpus: each starts with BOS, ends
// with the end of an assistant turn, every supervised run is one assistant turn
// ending with its end-of-turn token, and the split tokenization is the one the
// runner gives the whole text.
func TestDocuments(t *testing.T) {
	g := generator(t)
	tok := g.l.Tokenizer
	seen := map[string]int{}
	n := 300
	if testing.Short() {
		n = 60
	}
	for i := range n {
		c, d, err := g.Document(i)
		if err != nil {
			t.Fatal(err)
		}
		seen[c.Kind]++
		if d.IDs[0] != int32(tok.BOS) || d.IDs[len(d.IDs)-1] != int32(tok.EOT) || !d.Supervised[len(d.IDs)-1] {
			t.Fatalf("document %d (%s) does not run from BOS to a supervised end of turn", i, c.Kind)
		}
		runs, sup := segments(d)
		for k, run := range runs {
			if !sup[k] {
				continue
			}
			if slices.Index(run, int32(tok.EOT)) != len(run)-1 || slices.Contains(run, int32(tok.BOS)) {
				t.Fatalf("document %d (%s): supervised run %d is not one assistant turn: %v", i, c.Kind, k, run)
			}
		}
		text, err := g.l.Decode(d.IDs)
		if err != nil {
			t.Fatal(err)
		}
		whole, err := g.l.Encode(text)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(whole, d.IDs); diff != "" {
			t.Fatalf("document %d (%s): the turn-by-turn tokens differ from the whole text's (-whole +turns):\n%s", i, c.Kind, diff)
		}
	}
	for _, k := range []string{"greeting", "answer", "tool-call", "json", "think", "quote"} {
		if seen[k] == 0 {
			t.Errorf("no %s document among the first %d (%v)", k, n, seen)
		}
	}
}

// TestDeterministic: a document is a function of the seed and its index.
func TestDeterministic(t *testing.T) {
	g := generator(t)
	other, err := NewGenerator(g.l, g.seed, filepath.Join("..", "..", "..", AgentFixtures))
	if err != nil {
		t.Fatal(err)
	}
	reseeded, err := NewGenerator(g.l, g.seed+1, filepath.Join("..", "..", "..", AgentFixtures))
	if err != nil {
		t.Fatal(err)
	}
	other.quoteEvery, reseeded.quoteEvery = g.quoteEvery, g.quoteEvery
	same := 0
	for _, i := range []int{0, 5, 17} {
		_, a, err1 := g.Document(i)
		_, b, err2 := other.Document(i)
		_, c, err3 := reseeded.Document(i)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatal(err1, err2, err3)
		}
		if !slices.Equal(a.IDs, b.IDs) || !slices.Equal(a.Supervised, b.Supervised) {
			t.Errorf("document %d differs between two generators of seed %d", i, g.seed)
		}
		if slices.Equal(a.IDs, c.IDs) {
			same++
		}
	}
	if same == 3 {
		t.Error("seeds 7 and 8 give the same documents")
	}
}

// TestQuotesOnlyWhereAsked: a generator of the same seed without quotes (the
// trained test model's corpus) makes no quote, and the documents a quote does not
// take are the same with and without them.
func TestQuotesOnlyWhereAsked(t *testing.T) {
	g := generator(t)
	plain, err := NewGenerator(g.l, g.seed, filepath.Join("..", "..", "..", AgentFixtures))
	if err != nil {
		t.Fatal(err)
	}
	quotes := 0
	for i := range 40 {
		a, errA := g.Conversation(i)
		b, errB := plain.Conversation(i)
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if b.Kind == "quote" {
			t.Fatalf("document %d is a quote in a corpus made without them", i)
		}
		if a.Kind == "quote" {
			quotes++
			continue
		}
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("document %d differs with quotes on (-on +off):\n%s", i, diff)
		}
	}
	if quotes != 40/g.quoteEvery {
		t.Errorf("%d quotes in the first 40 documents, one in %d: want %d", quotes, g.quoteEvery, 40/g.quoteEvery)
	}
}

// TestQuotesNameNoFileBeforeTheQuote: a quote's answer ends with the tool's result
// word for word, and where it quotes a file the answer does not hold the file's
// path: the model trained on quotes that began "The file PATH says:" answered a
// directory listing "The directory contains parser.rs says: …" (quoteLeads).
func TestQuotesNameNoFileBeforeTheQuote(t *testing.T) {
	g := generator(t)
	files := 0
	for i := g.quoteEvery - 1; i < 400; i += g.quoteEvery {
		c, err := g.Conversation(i)
		if err != nil {
			t.Fatal(err)
		}
		if c.Kind != "quote" {
			t.Fatalf("document %d is a %s, want a quote (one in %d)", i, c.Kind, g.quoteEvery)
		}
		n := len(c.Messages)
		call, result, answer := c.Messages[n-3].ToolCalls[0], string(c.Messages[n-2].Content), string(c.Messages[n-1].Content)
		var args map[string]string
		if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if _, ok := args["query"]; ok {
			if !strings.Contains(answer, mustSnippet(t, result)) {
				t.Errorf("document %d: the answer %q does not quote the snippet of %q", i, answer, result)
			}
			continue
		}
		files++
		if !strings.HasSuffix(answer, result) {
			t.Errorf("document %d: the answer %q does not end with the file %q", i, answer, result)
		}
		for _, path := range args {
			if strings.Contains(answer, path) {
				t.Errorf("document %d: the answer names the file %q before its quote: %q", i, path, answer)
			}
		}
	}
	if files < 20 {
		t.Errorf("%d quotes of a file in 40 quotes, want most of them", files)
	}
}

// mustSnippet is a search result's one snippet.
func mustSnippet(t *testing.T, result string) string {
	t.Helper()
	var r struct {
		Results []struct{ Snippet string } `json:"results"`
	}
	if err := json.Unmarshal([]byte(result), &r); err != nil || len(r.Results) != 1 {
		t.Fatalf("search result %q: %v", result, err)
	}
	return r.Results[0].Snippet
}

// TestToolCalls: in every document with a call, the call names a tool the request
// offers, in the Llama 3 JSON format, with arguments taken from the user's words;
// and the final answer carries the tool's result.
func TestToolCalls(t *testing.T) {
	g := generator(t)
	calls, agents := 0, 0
	conversations(t, g, 8000, func(i int, c Conversation) bool {
		k := slices.IndexFunc(c.Messages, func(m runnerapi.Message) bool { return len(m.ToolCalls) > 0 })
		if k < 0 {
			return false
		}
		calls++
		if strings.HasPrefix(c.Kind, "agent-") {
			agents++
		}
		d, err := g.l.Tokens(c)
		if err != nil {
			t.Fatal(err)
		}
		runs, sup := segments(d)
		var turns []string
		for j, run := range runs {
			if sup[j] {
				s, _ := g.l.Decode(run[:len(run)-1])
				turns = append(turns, s)
			}
		}
		var call struct {
			Name       string         `json:"name"`
			Parameters map[string]any `json:"parameters"`
		}
		if err := json.Unmarshal([]byte(turns[len(turns)-2]), &call); err != nil {
			t.Fatalf("document %d (%s): the call turn %q is not Llama 3 JSON: %v", i, c.Kind, turns[len(turns)-2], err)
		}
		if !slices.ContainsFunc(c.Tools, func(tl runnerapi.Tool) bool { return tl.Function.Name == call.Name }) {
			t.Errorf("document %d (%s): calls %q, which the request does not offer", i, c.Kind, call.Name)
		}
		user := string(c.Messages[k-1].Content)
		for p, v := range call.Parameters {
			s, ok := v.(string)
			if !ok {
				continue
			}
			words := []string{s}
			if strings.HasPrefix(c.Kind, "agent-") { // a command: ls or cat, and what the user named
				words = strings.Fields(s)
				if words[0] != "ls" && words[0] != "cat" {
					t.Errorf("document %d (%s): the command %q lists no files and reads none", i, c.Kind, s)
				}
				words = words[1:]
			}
			for _, w := range words {
				if !strings.Contains(user, w) {
					t.Errorf("document %d (%s): argument %s=%q is not in the question %q", i, c.Kind, p, s, user)
				}
			}
		}
		result := string(c.Messages[k+1].Content)
		if _, out, ok := strings.Cut(result, "\nOutput:\n"); ok { // exec_command's header
			result = strings.TrimSuffix(out, "\n")
		}
		final := turns[len(turns)-1]
		for _, line := range strings.Split(result, "\n") {
			if !strings.HasPrefix(line, "{") && !strings.Contains(final, line) {
				t.Errorf("document %d (%s): the answer %q leaves out the result %q", i, c.Kind, final, line)
			}
		}
		return calls >= 200 && agents >= 3
	})
}

// TestNoFormatErrors: no message of the corpus carries a formatting error of fmt
// ("%!(EXTRA int=3)" ended two of the three listing answers of the coding agents,
// and the model learned to write it).
func TestNoFormatErrors(t *testing.T) {
	g := generator(t)
	agents := 0
	conversations(t, g, 8000, func(i int, c Conversation) bool {
		if strings.HasPrefix(c.Kind, "agent-") {
			agents++
		}
		for _, m := range c.Messages {
			if text := string(m.Content); strings.Contains(text, "%!") {
				t.Fatalf("document %d (%s), a %s message: %q", i, c.Kind, m.Role, text)
			}
		}
		return agents >= 30
	})
}

// conversations calls f with documents 0, 1, … of g until f says it has seen
// enough, and fails the test when the first limit documents are not enough.
func conversations(t *testing.T, g *Generator, limit int, f func(i int, c Conversation) (enough bool)) {
	t.Helper()
	for i := range limit {
		c, err := g.Conversation(i)
		if err != nil {
			t.Fatal(err)
		}
		if f(i, c) {
			return
		}
	}
	t.Fatalf("the first %d documents are not enough", limit)
}

// TestCodexData: Codex CLI's documents carry what the client writes as data as it
// writes it, not prose: the environment context before the prompt and the header of
// exec_command's output (the model that saw prose there called exec_command with
// another tool's arguments when it met the real request).
func TestCodexData(t *testing.T) {
	g := generator(t)
	envs, outputs := 0, 0
	conversations(t, g, 20000, func(i int, c Conversation) bool {
		if c.Kind != "agent-codex" {
			return false
		}
		var users []string
		for _, m := range c.Messages {
			if m.Role == "user" {
				users = append(users, string(m.Content))
			}
			if m.Role == "tool" {
				outputs++
				if !execHeader.MatchString(string(m.Content)) {
					t.Errorf("document %d: exec_command's result %q has no header", i, m.Content)
				}
			}
		}
		if len(users) != 2 {
			t.Fatalf("document %d: %d user messages, want the environment and the prompt", i, len(users))
		}
		envs++
		if !environment.MatchString(users[0]) {
			t.Errorf("document %d: the message before the prompt is %q, not an environment context", i, users[0])
		}
		return envs >= 5 && outputs >= 3
	})
}

var (
	environment = regexp.MustCompile(`^<environment_context>\n  <cwd>(/[^<]+)</cwd>\n  <shell>\w+</shell>\n` +
		`  <current_date>\d{4}-\d\d-\d\d</current_date>\n  <timezone>[\w/]+</timezone>\n` +
		`  <filesystem><workspace_roots><root>(/[^<]+)</root></workspace_roots>.*</filesystem>\n</environment_context>$`)
	execHeader = regexp.MustCompile(`^Chunk ID: [0-9a-f]{6}\nWall time: \d\.\d{4} seconds\nProcess exited with code 0\n` +
		`Original token count: \d+\nOutput:\n(?s:.+)\n$`)
)

// TestClaudeReminders: Claude Code's documents carry a reminder before the prompt
// in the prompt's own message, as the client writes it, naming files and commands
// the prompt does not ask for (the model that saw prose there read a file its real
// reminder named instead of listing the directory).
func TestClaudeReminders(t *testing.T) {
	g := generator(t)
	seen := 0
	conversations(t, g, 20000, func(i int, c Conversation) bool {
		if c.Kind != "agent-claude" {
			return false
		}
		var prompt string
		for _, m := range c.Messages {
			if m.Role == "user" {
				prompt = string(m.Content)
			}
		}
		m := reminder.FindStringSubmatch(prompt)
		if m == nil {
			t.Fatalf("document %d: the prompt's message %q has no reminder before the prompt", i, prompt)
		}
		if strings.Contains(m[2], "<system-reminder>") || strings.TrimSpace(m[2]) == "" {
			t.Errorf("document %d: after the reminder %q, not a prompt", i, m[2])
		}
		seen++
		return seen >= 8
	})
}

var reminder = regexp.MustCompile(`^<system-reminder>\n(?s:(.+))\n</system-reminder>\n*(?s:(.+))$`)
