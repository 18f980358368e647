package chat

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHarmonyStreams: the analysis and final channels' text is returned as it comes,
// holding back only what may be the start of an end mark; a call's message is held
// until it ends.
func TestHarmonyStreams(t *testing.T) {
	p := NewParser(Options{Format: FormatHarmony, Tools: true})
	steps := []struct {
		push string
		want Delta
	}{
		{"<|channel|>analy", Delta{}},
		{"sis<|message|>Need the", Delta{Reasoning: "Need the"}},
		{" time.<|e", Delta{Reasoning: " time."}},
		{"nd|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\"", Delta{}},
		{":\"UTC\"}<|call|>", Delta{}}, // the call: checked below without its id
		{"<|channel|>final<|message|>It is <|", Delta{Content: "It is "}},
		{"noon", Delta{Content: "<|noon"}},
	}
	for i, s := range steps {
		got := p.Push(s.push)
		if i == 4 {
			if len(got.ToolCalls) != 1 || got.ToolCalls[0].Function.Name != "get_time" || got.ToolCalls[0].Function.Arguments != `{"tz":"UTC"}` {
				t.Fatalf("push %q: %+v, want the call", s.push, got)
			}
			continue
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("push %q (-want +got):\n%s", s.push, diff)
		}
	}
	if got := p.Finish(); !got.Empty() {
		t.Errorf("finish: %+v", got)
	}

	// Without tools (response_format's answer) the final channel streams the same way.
	q := NewParser(Options{Format: FormatHarmony})
	for _, s := range []struct{ push, want string }{
		{"<|channel|>final<|message|>{ \"zone\"", `{ "zone"`}, {" :\"UT", ` :"UT`}, {"C\" }<|re", `C" }`}, {"turn|>", ""},
	} {
		if got := q.Push(s.push); got.Content != s.want || got.Reasoning != "" || len(got.ToolCalls) > 0 {
			t.Errorf("without tools, push %q: %+v, want content %q as it comes", s.push, got, s.want)
		}
	}
}

// harmonyCases are harmony outputs with the recipient in the role part of the header
// (before <|channel|>), as gpt-oss writes it too, beside the channel part's; every
// case with a call was content (or nothing) before the role part was read.
var harmonyCases = []struct {
	name   string
	opts   Options
	output string
	want   answer
}{
	{"recipient in the role part", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"role part with the content type as a word", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"role part, the constrain mark unspaced", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=functions.get_time<|channel|>commentary<|constrain|>json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"the answer begins at the recipient", Options{Format: FormatHarmony, Tools: true},
		"to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"the answer begins at a spaced recipient", Options{Format: FormatHarmony, Tools: true},
		" to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"analysis, then a call named in the role part", Options{Format: FormatHarmony, Tools: true},
		"<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Reasoning: "Need the time.", Calls: []call{{"get_time", `{"tz":"UTC"}`}}}},
	{"both forms in one answer", Options{Format: FormatHarmony, Tools: true, Parallel: true},
		"<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>" +
			"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
		answer{Calls: []call{{"get_time", `{"tz":"UTC"}`}, {"get_weather", `{"city":"Paris"}`}}}},
	// What was already so, kept: a recipient that is no function (a built-in tool's)
	// leaves the message its channel's text, wherever it is written; without tools a
	// call is content; a blank name is content.
	{"built-in recipient in the role part is content", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=browser.search<|channel|>commentary <|constrain|>json<|message|>{\"q\":\"x\"}<|call|>",
		answer{Content: `{"q":"x"}`}},
	{"built-in recipient on the analysis channel is reasoning", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=browser.search<|channel|>analysis<|message|>look it up<|end|>",
		answer{Reasoning: "look it up"}},
	{"role part call without tools is content", Options{Format: FormatHarmony},
		"to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Content: `{"tz":"UTC"}`}},
	{"role part call without a name is content", Options{Format: FormatHarmony, Tools: true},
		"<|start|>assistant to=functions.<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}<|call|>",
		answer{Content: `{"tz":"UTC"}`}},
}

// TestHarmonyRecipient: a call is read wherever its header names the function, whole
// and split across two pushes at every byte; other recipients keep their channel.
func TestHarmonyRecipient(t *testing.T) {
	for _, tc := range harmonyCases {
		if got := collect(NewParser(tc.opts), []string{tc.output}); !cmp.Equal(tc.want, got) {
			t.Errorf("%s (-want +got):\n%s", tc.name, cmp.Diff(tc.want, got))
			continue
		}
		for k := 1; k < len(tc.output); k++ {
			got := collect(NewParser(tc.opts), []string{tc.output[:k], tc.output[k:]})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s split at byte %d (-want +got):\n%s", tc.name, k, diff)
				break
			}
		}
	}
}

// TestHarmonyRecipientByteByByte: the role-part call pushed a byte at a time is the
// same call, and nothing of its header comes out as text on the way.
func TestHarmonyRecipientByteByByte(t *testing.T) {
	const out = "<|channel|>analysis<|message|>Need it.<|end|> to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{\"tz\":\"UTC\"}<|call|>"
	chunks := make([]string, len(out))
	for i := range out {
		chunks[i] = out[i : i+1]
	}
	want := answer{Reasoning: "Need it.", Calls: []call{{"get_time", `{"tz":"UTC"}`}}}
	if diff := cmp.Diff(want, collect(NewParser(Options{Format: FormatHarmony, Tools: true}), chunks)); diff != "" {
		t.Errorf("byte by byte (-want +got):\n%s", diff)
	}
}

// TestHarmonyHeaderFields: the channel and the recipient, from either part.
func TestHarmonyHeaderFields(t *testing.T) {
	for _, tc := range []struct{ role, channelPart, channel, recipient string }{
		{"", "commentary to=functions.f <|constrain|>json", "commentary", "to=functions.f"},
		{"", "commentary to=functions.f json", "commentary", "to=functions.f"},
		{"", "commentary to=functions.f<|constrain|>json", "commentary", "to=functions.f"},
		{" to=functions.f", "commentary <|constrain|>json", "commentary", "to=functions.f"},
		{"to=functions.f", "commentary json", "commentary", "to=functions.f"},
		{"<|start|>assistant to=functions.f", "commentary", "commentary", "to=functions.f"},
		{"to=functions.f", "commentary to=functions.g", "commentary", "to=functions.g"},
		{"to=browser.search", "commentary", "commentary", "to=browser.search"},
		{"", "analysis", "analysis", ""},
		{"", " final ", "final", ""},
		{"", "", "", ""},
	} {
		ch, rc := harmonyHeaderFields(tc.role, tc.channelPart)
		if ch != tc.channel || rc != tc.recipient {
			t.Errorf("(%q, %q): %q %q, want %q %q", tc.role, tc.channelPart, ch, rc, tc.channel, tc.recipient)
		}
	}
}
