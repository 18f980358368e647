package clientrecord

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRedact(t *testing.T) {
	long := strings.Repeat("x", MaxKeptString+1)
	kept := strings.Repeat("y", MaxKeptString)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"short strings, numbers, bools and nulls stay",
			`{"model":"team-a/assistant","max_tokens":32000,"stream":true,"temperature":0.5,"stop":null}`,
			`{"max_tokens":32000,"model":"team-a/assistant","stop":null,"stream":true,"temperature":0.5}`},
		{"a string of exactly the bound stays, one rune more goes",
			`{"a":"` + kept + `","b":"` + long + `"}`,
			`{"a":"` + kept + `","b":"<redacted 41 chars>"}`},
		{"length counts characters, not bytes",
			`{"a":"` + strings.Repeat("é", MaxKeptString) + `"}`,
			`{"a":"` + strings.Repeat("é", MaxKeptString) + `"}`},
		{"prose keys go however short",
			`{"text":"hi","description":"d","instructions":"","content":"Say hi","name":"Bash"}`,
			`{"content":"<redacted 6 chars>","description":"<redacted 1 chars>","instructions":"<redacted 0 chars>","name":"Bash","text":"<redacted 2 chars>"}`},
		{"prose arrays and nested content blocks",
			`{"content":["a",{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]}`,
			`{"content":["<redacted 1 chars>",{"cache_control":{"type":"ephemeral"},"text":"<redacted 1 chars>","type":"text"}]}`},
		{"schemas keep their shape, enum values and property names",
			`{"tools":[{"name":"Read","description":"` + long + `","input_schema":{"type":"object","properties":{"file_path":{"type":"string","description":"p"},"mode":{"enum":["a","b"]}},"required":["file_path"]}}]}`,
			`{"tools":[{"description":"<redacted 41 chars>","input_schema":{"properties":{"file_path":{"description":"<redacted 1 chars>","type":"string"},"mode":{"enum":["a","b"]}},"required":["file_path"],"type":"object"},"name":"Read"}]}`},
		{"numbers keep their spelling",
			`{"n":1e3,"m":12345678901234567890}`,
			`{"m":12345678901234567890,"n":1e3}`},
		{"no HTML escaping",
			`["<b>&"]`,
			`["<b>&"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Redact([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(compact(t, tc.want), compact(t, string(got))); diff != "" {
				t.Errorf("Redact(%s) (-want +got):\n%s", tc.in, diff)
			}
			if !strings.HasSuffix(string(got), "}\n") && !strings.HasSuffix(string(got), "]\n") {
				t.Errorf("Redact(%s) = %q, want indented JSON ending in a newline", tc.in, got)
			}
		})
	}
}

func TestRedactRefusesInvalidJSON(t *testing.T) {
	for _, in := range []string{``, `{`, `{"a":1} {"b":2}`, `nope`} {
		if _, err := Redact([]byte(in)); err == nil {
			t.Errorf("Redact(%q) succeeded, want an error", in)
		}
	}
}

func TestRedactIsIdempotent(t *testing.T) {
	in := `{"system":[{"type":"text","text":"` + strings.Repeat("z", 500) + `"}],"metadata":{"user_id":"` + strings.Repeat("u", 64) + `"}}`
	once, err := Redact([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	twice, err := Redact(once)
	if err != nil {
		t.Fatal(err)
	}
	if string(once) != string(twice) {
		t.Errorf("redacting a redacted document changed it:\n%s\n%s", once, twice)
	}
}

// compact re-encodes a JSON document without spaces, keys sorted, numbers as spelled.
func compact(t *testing.T, s string) string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFixture(t *testing.T) {
	x := Exchange{Method: "POST", Path: "/v1/messages?beta=true",
		Header: map[string]string{"anthropic-version": "2023-06-01", "x-api-key": "sk-secret",
			"authorization": "Bearer sk-secret", "content-length": "99", "user-agent": "client/1.0"},
		Body: []byte(`{"model":"m","system":"` + strings.Repeat("s", 100) + `"}`)}
	got, err := Fixture(x)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"body":{"model":"m","system":"<redacted 100 chars>"},"header":{"anthropic-version":"2023-06-01","user-agent":"client/1.0"},"method":"POST","path":"/v1/messages?beta=true"}`
	if diff := cmp.Diff(compact(t, want), compact(t, string(got))); diff != "" {
		t.Errorf("Fixture (-want +got):\n%s", diff)
	}
	if strings.Contains(string(got), "sk-secret") {
		t.Errorf("the fixture holds a credential:\n%s", got)
	}
	if _, err := Fixture(Exchange{Body: []byte("not json")}); err == nil {
		t.Error("Fixture of a body that is not JSON succeeded")
	}
}
