package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestContinueFinalMessage: with runnerapi.HeaderContinue, a greedy answer cut after a
// few tokens and sent back as the final assistant message is continued where it was
// cut, to the same answer, with the logprobs of the tokens it generated; its usage counts the cut answer as completion tokens (the
// prompt as without it) and max_tokens bounds the whole answer.
func TestContinueFinalMessage(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	const maxTokens = 12
	body := chatBody("Tell me a story about a river", maxTokens, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	body["logprobs"] = true // each token's text: where to cut
	full, pieces, usage := streamContinue(t, r, body, "")
	if usage.CompletionTokens != maxTokens || len(pieces) < 4 {
		t.Fatalf("the uncut answer: %d tokens, usage %+v; want %d completion tokens", len(pieces), usage, maxTokens)
	}
	cut := strings.Join(pieces[:3], "")
	body["messages"] = []map[string]string{{"role": "user", "content": "Tell me a story about a river"},
		{"role": "assistant", "content": cut}}
	rest, restTokens, cont := streamContinue(t, r, body, runnerapi.ContinueFinalMessage)
	if cut+rest != full {
		t.Errorf("continued answer %q + %q, want %q", cut, rest, full)
	}
	// The logprobs are the generated tokens', not the continued text's.
	if want := pieces[3:]; !slices.Equal(restTokens, want) {
		t.Errorf("the continuation's logprobs are of tokens %q, want %q", restTokens, want)
	}
	if cont.PromptTokens != usage.PromptTokens || cont.CompletionTokens != maxTokens || cont.TotalTokens != usage.TotalTokens {
		t.Errorf("continued usage %+v, want the uncut answer's %+v", cont, usage)
	}
	if cont.PromptTokensDetails != nil && cont.PromptTokensDetails.CachedTokens > cont.PromptTokens {
		t.Errorf("cached tokens %d exceed the prompt's %d", cont.PromptTokensDetails.CachedTokens, cont.PromptTokens)
	}

	// A cut answer holding a NUL byte (the text of a byte-fallback token <0x00>, which
	// a sampled answer of a byte-level vocabulary may hold) is continued like any.
	body["messages"] = []map[string]string{{"role": "user", "content": "Tell me a story about a river"},
		{"role": "assistant", "content": pieces[0] + "\x00" + pieces[1]}}
	if rest, _, nul := streamContinue(t, r, body, runnerapi.ContinueFinalMessage); rest == "" || nul.CompletionTokens <= 2 {
		t.Errorf("the answer cut with a NUL byte was continued with %q, usage %+v; want more of it", rest, nul)
	}

	// Without an assistant message to continue, or with n > 1, or an unknown mode: 400.
	for name, tc := range map[string]struct {
		mode   string
		mutate func(map[string]any)
		want   string
	}{
		"ends with the user": {mode: runnerapi.ContinueFinalMessage, want: "end with the assistant's partial message",
			mutate: func(b map[string]any) { b["messages"] = chatBody("hi", 1, false)["messages"] }},
		"n > 1":       {mode: runnerapi.ContinueFinalMessage, want: "one choice at a time", mutate: func(b map[string]any) { b["n"] = 2 }},
		"other modes": {mode: "next-turn", want: runnerapi.HeaderContinue + " must be", mutate: func(map[string]any) {}},
	} {
		b := map[string]any{}
		for k, v := range body {
			b[k] = v
		}
		tc.mutate(b)
		resp := postChat(t, r, b, runnerapi.HeaderContinue, tc.mode)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), tc.want) {
			t.Errorf("%s: %d %s, want 400 saying %q", name, resp.StatusCode, msg, tc.want)
		}
	}
}

// streamContinue streams a chat (continuing its final message with mode set) and
// returns its content, its tokens' texts (with logprobs asked for) and its usage.
func streamContinue(t *testing.T, r *runner, body map[string]any, mode string) (string, []string, runnerapi.Usage) {
	t.Helper()
	var hdr []string
	if mode != "" {
		hdr = []string{runnerapi.HeaderContinue, mode}
	}
	resp := postChat(t, r, body, hdr...)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var pieces []string
	var content strings.Builder
	var usage *runnerapi.Usage
	_, done, err := readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c runnerapi.ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				content.WriteString(*ch.Delta.Content)
			}
			if ch.Logprobs != nil {
				for _, lp := range ch.Logprobs.Content {
					pieces = append(pieces, lp.Token)
				}
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		return true
	})
	if err != nil || !done || usage == nil {
		t.Fatalf("stream: done %v, usage %v, %v", done, usage, err)
	}
	return content.String(), pieces, *usage
}

// TestContinueUnderGrammar: an answer under response_format (a JSON schema) cut after
// some characters and sent back as the final assistant message is continued under the
// same grammar advanced past the cut, so the whole answer follows the schema (a
// grammar started over would write a second object after the cut); an assistant
// message the grammar does not accept is refused with a 400 that says so (the gateway
// then ends the stream rather than try another replica).
func TestContinueUnderGrammar(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	schema := compileSchema(t, personSchema)
	body := chatBody("Describe a person", 120, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person",
		"strict": true, "schema": json.RawMessage(personSchema)}}
	full, _, _ := streamContinue(t, r, body, "")
	if err := validate(t, schema, full); err != nil {
		t.Fatalf("the uncut answer %q: %v", full, err)
	}
	runes := []rune(full)
	for _, at := range []int{1, 4, len(runes) / 2, len(runes) - 2} {
		cut := string(runes[:at])
		body["messages"] = []map[string]string{{"role": "user", "content": "Describe a person"},
			{"role": "assistant", "content": cut}}
		rest, _, _ := streamContinue(t, r, body, runnerapi.ContinueFinalMessage)
		if err := validate(t, schema, cut+rest); err != nil {
			t.Errorf("cut after %d characters: %q + %q: %v", at, cut, rest, err)
		}
	}
	body["messages"] = []map[string]string{{"role": "user", "content": "Describe a person"},
		{"role": "assistant", "content": "Sure: {"}}
	resp := postChat(t, r, body, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), "does not follow the grammar of response_format") {
		t.Errorf("a message the grammar does not accept: %d %s, want 400 saying so", resp.StatusCode, msg)
	}
}

// TestStructuredDatesAreCalendarDates: under a json_schema with a string of format
// "date", an answer may hold only days its month has (February 29 in leap years
// alone): continuing a message cut inside such a date is refused where the day does
// not exist and goes on where it does.
func TestStructuredDatesAreCalendarDates(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	body := chatBody("A date", 16, false)
	body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "day",
		"strict": true, "schema": json.RawMessage(`{"type":"object","properties":{"d":{"type":"string","format":"date"}},"required":["d"]}`)}}
	for _, c := range []struct {
		date string
		ok   bool
	}{
		{"2023-12-31", true}, {"2023-09-30", true}, {"2024-02-29", true}, {"2000-02-29", true}, {"1600-02-29", true},
		{"2023-02-28", true}, {"0000-02-29", true},
		{"2023-09-31", false}, {"2023-02-29", false}, {"1900-02-29", false}, {"2023-02-30", false}, {"2023-11-31", false},
		{"2023-13-01", false}, {"2023-00-10", false},
	} {
		body["messages"] = []map[string]string{{"role": "user", "content": "A date"},
			{"role": "assistant", "content": `{"d":"` + c.date}}
		resp := postChat(t, r, body, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		refused := resp.StatusCode == http.StatusBadRequest && strings.Contains(string(msg), "does not follow the grammar of response_format")
		switch {
		case c.ok && resp.StatusCode != http.StatusOK:
			t.Errorf("%s: %d %s, want the answer continued", c.date, resp.StatusCode, msg)
		case !c.ok && !refused:
			t.Errorf("%s: %d %s, want 400: no such day", c.date, resp.StatusCode, msg)
		}
	}
}

// TestContinueInReasoning: an answer cut inside its reasoning and sent back as the
// final assistant message's reasoning_content (no content yet) goes on as reasoning,
// inside the open <think> block; one with content after its reasoning goes on as
// content.
func TestContinueInReasoning(t *testing.T) {
	r := startReady(t, specModel(t, "tiny-thinking", func() (ggufsynth.Spec, error) {
		s := ggufsynth.Tiny()
		s.ChatTemplate = thinkingTemplate
		return s, nil
	}))
	stream := func(last map[string]any) (reasoning, content string) {
		t.Helper()
		b := chatBody("Think about it", 12, true)
		b["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
		hdr := []string{}
		if last != nil {
			b["messages"] = []map[string]any{{"role": "user", "content": "Think about it"}, last}
			hdr = []string{runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage}
		}
		resp := postChat(t, r, b, hdr...)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, msg)
		}
		return readThought(t, resp.Body)
	}
	full, _ := stream(nil)
	runes := []rune(full)
	if len(runes) < 4 {
		t.Fatalf("the uncut reasoning %q is too short to cut", full)
	}
	cut := string(runes[:len(runes)/2])
	rest, _ := stream(map[string]any{"role": "assistant", "content": "", "reasoning_content": cut})
	if rest == "" {
		t.Errorf("continued inside the reasoning %q: no reasoning followed, want the output to go on as reasoning", cut)
	}
	reasoning, content := stream(map[string]any{"role": "assistant", "content": "One", "reasoning_content": "Hm."})
	if reasoning != "" || content == "" {
		t.Errorf("continued after the reasoning: reasoning %q content %q, want content only", reasoning, content)
	}
}
