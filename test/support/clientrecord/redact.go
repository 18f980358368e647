package clientrecord

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"unicode/utf8"
)

// MaxKeptString is the longest string value Redact keeps: longer ones are prose (system
// prompts, tool descriptions, file contents), not names or enum values.
const MaxKeptString = 40

// proseKeys name string values that are always text, however short.
var proseKeys = map[string]bool{"text": true, "description": true, "instructions": true, "content": true}

// Redact returns a JSON document with the structure of doc and none of its prose:
// every string value longer than MaxKeptString characters, and every string under a
// key of proseKeys, becomes "<redacted N chars>"; keys, numbers, booleans, nulls,
// short strings (names, enum values, types) and the nesting of objects and arrays stay.
// Recorded requests carry their vendor's system prompts and tool descriptions, which
// must not be copied into this repository; what the translators must accept is the
// shape. The output is indented with sorted keys, so fixtures diff well.
func Redact(doc []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("redacting: %w", err)
	}
	if d.More() {
		return nil, fmt.Errorf("redacting: trailing data after the JSON value")
	}
	return Marshal(redact(v, false))
}

// Marshal indents v with sorted keys and without HTML escaping, ending in a newline.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	e.SetIndent("", "  ")
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

var placeholder = regexp.MustCompile(`^<redacted [0-9]+ chars>$`)

func redact(v any, prose bool) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for _, k := range sortedKeys(v) {
			out[k] = redact(v[k], proseKeys[k])
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			// The elements of a prose array (content: ["…"]) are prose too.
			out[i] = redact(e, prose)
		}
		return out
	case string:
		if placeholder.MatchString(v) {
			return v // already redacted: Redact is idempotent
		}
		if n := utf8.RuneCountInString(v); prose || n > MaxKeptString {
			return fmt.Sprintf("<redacted %d chars>", n)
		}
		return v
	default:
		return v
	}
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// fixtureSkipHeaders are transport details that say nothing about the client's request
// (content-length also stops matching once the body is redacted).
var fixtureSkipHeaders = map[string]bool{"content-length": true, "host": true, "connection": true,
	"accept-encoding": true}

// Fixture is a recorded request as a golden fixture: its method, path, headers (no
// credentials, no transport details) and its body through Redact.
func Fixture(x Exchange) ([]byte, error) {
	body, err := Redact(x.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", x.Method, x.Path, err)
	}
	header := map[string]string{}
	for k, v := range x.Header {
		if !fixtureSkipHeaders[k] && !credentialHeaders[k] {
			header[k] = v
		}
	}
	return Marshal(map[string]any{"method": x.Method, "path": x.Path, "header": header,
		"body": json.RawMessage(body)})
}
