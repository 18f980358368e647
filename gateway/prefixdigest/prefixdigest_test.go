package prefixdigest

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// One conversation (a system prompt, a tool, a user question, an assistant tool call,
// its result, the answer, a follow-up) as each of the three chat APIs carries it.
const (
	chatBody = `{"model":"m","messages":[
 {"role":"system","content":"You are terse."},
 {"role":"user","content":"Weather in Paris?"},
 {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
 {"role":"tool","tool_call_id":"call_1","content":"18 degrees"},
 {"role":"assistant","content":[{"type":"text","text":"It is 18."}]},
 {"role":"user","content":"And tomorrow?"}],
 "tools":[{"type":"function","function":{"name":"weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`
	responsesBody = `{"model":"m","instructions":"You are terse.","input":[
 {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},
 {"type":"function_call","call_id":"fc_9","name":"weather","arguments":"{\"unit\":\"c\",\"city\":\"Paris\"}"},
 {"type":"function_call_output","call_id":"fc_9","output":"18 degrees"},
 {"type":"reasoning","summary":[]},
 {"role":"assistant","content":[{"type":"output_text","text":"It is 18."}]},
 {"role":"user","content":"And tomorrow?"}],
 "tools":[{"type":"function","name":"weather","description":"Current weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"}}]}`
	anthropicBody = `{"model":"m","max_tokens":64,"system":[{"type":"text","text":"You are terse."}],"messages":[
 {"role":"user","content":"Weather in Paris?"},
 {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris","unit":"c"}}]},
 {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18 degrees"}]},
 {"role":"assistant","content":"It is 18."},
 {"role":"user","content":[{"type":"text","text":"And tomorrow?"}]}],
 "tools":[{"name":"weather","description":"Current weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]}`
)

var digestFormat = regexp.MustCompile(`^[0-9a-f]{16}$`)

// TestSameConversationThroughEveryAPI: the three APIs give one conversation the same
// digests (head + 5 messages = 6).
func TestSameConversationThroughEveryAPI(t *testing.T) {
	want := Of("team-a", "ns/llama", []byte(chatBody))
	if len(want) != 6 {
		t.Fatalf("chat: %d digests %v, want 6", len(want), want)
	}
	for _, d := range want {
		if !digestFormat.MatchString(d) {
			t.Fatalf("digest %q is not 16 lowercase hex digits", d)
		}
	}
	for name, body := range map[string]string{"responses": responsesBody, "anthropic": anthropicBody} {
		if got := Of("team-a", "ns/llama", []byte(body)); !slices.Equal(got, want) {
			c, _ := Parse([]byte(body))
			w, _ := Parse([]byte(chatBody))
			t.Errorf("%s: digests %v, want chat's %v\n%s: %+v\nchat: %+v", name, got, want, name, c, w)
		}
	}
}

// TestDigests covers what changes the chain and what does not.
func TestDigests(t *testing.T) {
	base := Of("p", "ns/m", []byte(chatBody))
	tests := []struct {
		name           string
		partition, mdl string
		body           string
		sharedWithBase int // how many leading digests equal base's
		wantLen        int
	}{
		{name: "extended conversation keeps earlier digests", partition: "p", mdl: "ns/m",
			body:           strings.Replace(chatBody, `"And tomorrow?"}]`, `"And tomorrow?"},{"role":"assistant","content":"20."},{"role":"user","content":"Thanks"}]`, 1),
			sharedWithBase: 6, wantLen: 8},
		{name: "another partition shares nothing", partition: "q", mdl: "ns/m", body: chatBody, wantLen: 6},
		{name: "no partition shares nothing", partition: "", mdl: "ns/m", body: chatBody, wantLen: 6},
		{name: "another model shares nothing", partition: "p", mdl: "ns/other", body: chatBody, wantLen: 6},
		{name: "another system prompt shares nothing", partition: "p", mdl: "ns/m",
			body: strings.Replace(chatBody, "You are terse.", "You are verbose.", 1), wantLen: 6},
		{name: "another tool shares nothing", partition: "p", mdl: "ns/m",
			body: strings.Replace(chatBody, "Current weather", "Weather now", 1), wantLen: 6},
		{name: "a changed last message keeps the rest", partition: "p", mdl: "ns/m",
			body: strings.Replace(chatBody, "And tomorrow?", "And Monday?", 1), sharedWithBase: 5, wantLen: 6},
		{name: "changed tool arguments change from that message", partition: "p", mdl: "ns/m",
			body: strings.Replace(chatBody, `\"Paris\"`, `\"Lyon\"`, 1), sharedWithBase: 2, wantLen: 6},
		{name: "tool call ids do not count", partition: "p", mdl: "ns/m",
			body: strings.ReplaceAll(chatBody, "call_1", "call_xyz"), sharedWithBase: 6, wantLen: 6},
		{name: "a developer message is a system prompt", partition: "p", mdl: "ns/m",
			body: strings.Replace(chatBody, `"role":"system"`, `"role":"developer"`, 1), sharedWithBase: 6, wantLen: 6},
		{name: "a text completion has none", partition: "p", mdl: "ns/m", body: `{"model":"m","prompt":"hello"}`},
		{name: "an embedding has none", partition: "p", mdl: "ns/m", body: `{"model":"m","input":["a","b"]}`},
		{name: "not JSON has none", partition: "p", mdl: "ns/m", body: `{"model":`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Of(tc.partition, tc.mdl, []byte(tc.body))
			if len(got) != tc.wantLen {
				t.Fatalf("%d digests %v, want %d", len(got), got, tc.wantLen)
			}
			shared := 0
			for shared < min(len(got), len(base)) && got[shared] == base[shared] {
				shared++
			}
			if shared != tc.sharedWithBase {
				t.Errorf("shares %d leading digests with the base conversation, want %d", shared, tc.sharedWithBase)
			}
			for _, d := range got {
				if slices.Contains(base[tc.sharedWithBase:], d) {
					t.Errorf("digest %s of a different prefix equals one of the base's", d)
				}
			}
		})
	}
}

// TestMaxDigests: a long conversation carries runnerapi.MaxPrefixDigests digests, the
// deepest ones.
func TestMaxDigests(t *testing.T) {
	var msgs []string
	for i := range 100 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"turn %d"}`, i))
	}
	long := Of("", "m", []byte(`{"messages":[`+strings.Join(msgs, ",")+`]}`))
	if len(long) != runnerapi.MaxPrefixDigests {
		t.Fatalf("%d digests, want %d", len(long), runnerapi.MaxPrefixDigests)
	}
	shorter := Of("", "m", []byte(`{"messages":[`+strings.Join(msgs[:99], ",")+`]}`))
	if !slices.Equal(long[:runnerapi.MaxPrefixDigests-1], shorter[1:]) {
		t.Errorf("the kept digests are not the deepest: %v vs %v", long[:3], shorter[:3])
	}
}

// FuzzOf: any body gives at most MaxPrefixDigests well-formed digests, the same ones
// every time.
func FuzzOf(f *testing.F) {
	for _, b := range []string{chatBody, responsesBody, anthropicBody, `{"input":"hi"}`, `{"messages":[{"content":[1,{"type":"tool_result"}]}]}`} {
		f.Add("p", b)
	}
	f.Fuzz(func(t *testing.T, partition, body string) {
		got := Of(partition, "m", []byte(body))
		if len(got) > runnerapi.MaxPrefixDigests {
			t.Fatalf("%d digests", len(got))
		}
		for _, d := range got {
			if !digestFormat.MatchString(d) {
				t.Fatalf("digest %q", d)
			}
		}
		if again := Of(partition, "m", []byte(body)); !slices.Equal(got, again) {
			t.Fatalf("not deterministic: %v then %v", got, again)
		}
	})
}

// TestRoutable: digest 0 is left out of routing only when the head is empty, and only
// when the digests start with it (a conversation longer than MaxPrefixDigests has lost
// it already).
func TestRoutable(t *testing.T) {
	long := make([]string, runnerapi.MaxPrefixDigests+3)
	for i := range long {
		long[i] = fmt.Sprintf(`{"role":"user","content":"m%d"}`, i)
	}
	for _, tc := range []struct {
		name, body string
		dropFirst  bool
	}{
		{"no head", `{"messages":[{"role":"user","content":"hi"}]}`, true},
		{"system prompt", `{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"hi"}]}`, false},
		{"tools", `{"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}`, false},
		{"no head, beyond the bound", `{"messages":[` + strings.Join(long, ",") + `]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := Parse([]byte(tc.body))
			if !ok {
				t.Fatal("not parsed")
			}
			all := c.Digests("p", "m")
			got := c.Routable(all)
			want := all
			if tc.dropFirst {
				want = all[1:]
			}
			if !slices.Equal(got, want) {
				t.Errorf("Routable = %v, want %v (of %v)", got, want, all)
			}
		})
	}
	a, _ := Parse([]byte(`{"messages":[{"role":"user","content":"one"}]}`))
	b, _ := Parse([]byte(`{"messages":[{"role":"user","content":"two"}]}`))
	ra, rb := a.Routable(a.Digests("p", "m")), b.Routable(b.Digests("p", "m"))
	if len(ra) != 1 || len(rb) != 1 || ra[0] == rb[0] {
		t.Errorf("two head-less conversations share a routable digest: %v %v", ra, rb)
	}
}

// TestKeyedDigests: keyed digests are the same for one key (two gateways), differ
// from the unkeyed ones and from another key's at every depth, and keep a
// conversation's earlier prefixes' digests when it grows by a turn.
func TestKeyedDigests(t *testing.T) {
	turn1 := []byte(`{"model":"m","messages":[{"role":"system","content":"You review Go."},{"role":"user","content":"Review main.go"}]}`)
	turn2 := []byte(`{"model":"m","messages":[{"role":"system","content":"You review Go."},{"role":"user","content":"Review main.go"},` +
		`{"role":"assistant","content":"Looks fine."},{"role":"user","content":"And util.go?"}]}`)
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	digests := func(key, body []byte) []string {
		c, ok := Parse(body)
		if !ok {
			t.Fatalf("%s is not a chat request", body)
		}
		return c.KeyedDigests(key, "team-b", "ns/m")
	}
	a, b := digests(k1, turn1), digests(k1, turn1)
	if !slices.Equal(a, b) || len(a) != 2 {
		t.Fatalf("one key gave %v and %v, want the same two digests", a, b)
	}
	for _, other := range []struct {
		name    string
		digests []string
	}{
		{"unkeyed", Of("team-b", "ns/m", turn1)},
		{"another key", digests(k2, turn1)},
	} {
		if len(other.digests) != len(a) {
			t.Fatalf("%s: %d digests, want %d", other.name, len(other.digests), len(a))
		}
		for i := range a {
			if other.digests[i] == a[i] {
				t.Errorf("digest %d keyed is the same %s: %s", i, other.name, a[i])
			}
		}
	}
	if u, e := Of("team-b", "ns/m", turn1), digests(nil, turn1); !slices.Equal(u, e) {
		t.Errorf("an empty key gave %v, unkeyed %v", e, u)
	}
	if next := digests(k1, turn2); len(next) != 4 || !slices.Equal(next[:2], a) {
		t.Errorf("the next turn's keyed digests %v do not start with the first turn's %v", next, a)
	}
}
