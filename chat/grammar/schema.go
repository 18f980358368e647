package grammar

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/macfleet/macfleet/runner/api"
)

// Keywords of JSON Schema that constrained output enforces, and where the
// subschemas are.
var (
	// leaf keywords: enforced, no subschema.
	leafKeywords = set("type", "enum", "const", "required", "pattern", "minLength", "maxLength",
		"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "format", "$ref")
	// annotations change nothing in the output.
	annotations = set("title", "description", "default", "examples", "$schema", "$id", "$comment",
		"deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding")
	// subschema keywords: a schema, a map of schemas or a list of schemas.
	schemaKeywords = set("items", "additionalProperties")
	mapKeywords    = set("properties", "$defs", "definitions")
	listKeywords   = set("anyOf", "oneOf", "allOf", "prefixItems")
	types          = set("object", "array", "string", "number", "integer", "boolean", "null")
	formats        = regexp.MustCompile(`^(date|time|date-time|uuid[1-5]?)$`)
)

func set(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// CheckSchema refuses a schema that uses a keyword constrained output cannot enforce,
// naming the keyword and where it is, so no part of a schema is silently dropped.
func CheckSchema(schema json.RawMessage, param string) *api.Error {
	var v any
	if err := json.Unmarshal(schema, &v); err != nil {
		return api.InvalidRequest(api.CodeInvalidValue, param, "the schema is not valid JSON: %v", err)
	}
	if err := checkNode(v, ""); err != nil {
		return api.InvalidRequest(api.CodeUnsupportedParameter, param, "%s", err.Error())
	}
	return nil
}

func checkNode(v any, at string) error {
	switch n := v.(type) {
	case bool:
		return nil // true: anything; false: nothing
	case map[string]any:
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := checkKeyword(k, n[k], at+"/"+pointerEscape(k)); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("the schema at %q must be an object or a boolean", pointer(at))
}

func checkKeyword(k string, v any, at string) error {
	switch {
	case annotations[k]:
		return nil
	case k == "type":
		return checkType(v, at)
	case k == "format":
		if f, ok := v.(string); !ok || !formats.MatchString(f) {
			return fmt.Errorf("format %v at %q is not supported in constrained output (supported: date, time, date-time, uuid)", v, pointer(at))
		}
		return nil
	case leafKeywords[k]:
		return nil
	case schemaKeywords[k]:
		return checkNode(v, at)
	case mapKeywords[k]:
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s at %q must be an object of schemas", k, pointer(at))
		}
		for name, sub := range m {
			if err := checkNode(sub, at+"/"+pointerEscape(name)); err != nil {
				return err
			}
		}
		return nil
	case listKeywords[k]:
		l, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s at %q must be an array of schemas", k, pointer(at))
		}
		for i, sub := range l {
			if err := checkNode(sub, fmt.Sprintf("%s/%d", at, i)); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("the JSON Schema keyword %q (at %q) is not supported in constrained output; supported: %s",
		k, pointer(at), supportedList())
}

func checkType(v any, at string) error {
	check := func(t any) error {
		if s, ok := t.(string); ok && types[s] {
			return nil
		}
		return fmt.Errorf("type %v at %q is not a JSON Schema type", t, pointer(at))
	}
	if l, ok := v.([]any); ok {
		for _, t := range l {
			if err := check(t); err != nil {
				return err
			}
		}
		return nil
	}
	return check(v)
}

func supportedList() string {
	var all []string
	for _, m := range []map[string]bool{leafKeywords, schemaKeywords, mapKeywords, listKeywords} {
		for k := range m {
			all = append(all, k)
		}
	}
	sort.Strings(all)
	return strings.Join(all, ", ")
}

func pointer(at string) string {
	if at == "" {
		return "/"
	}
	return at
}

func pointerEscape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
