package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
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
// naming the keyword and where it is, so no part of a schema is silently dropped, and
// a schema over the limits (MaxSchemaBytes, MaxSchemaDepth, MaxSchemaWeight).
func CheckSchema(schema json.RawMessage, param string) *runnerapi.Error {
	return checkSchema(&budget{}, schema, param)
}

// checkSchema is CheckSchema spending from b, shared by the schemas of a request.
func checkSchema(b *budget, schema json.RawMessage, param string) *runnerapi.Error {
	if len(schema) > MaxSchemaBytes {
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "%s",
			(&LimitError{Limit: "schema size", Size: len(schema), Max: MaxSchemaBytes}).Error())
	}
	var v any
	if err := json.Unmarshal(schema, &v); err != nil {
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the schema is not valid JSON: %v", err)
	}
	err := b.node(v, "", 0)
	if d := jsonDepth(v, 0); err == nil && d > MaxJSONDepth {
		err = &LimitError{Limit: "JSON nesting", Size: d, Max: MaxJSONDepth}
	}
	if err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "%s", err.Error())
		}
		return runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, param, "%s", err.Error())
	}
	return nil
}

// node checks the schema node v at the JSON pointer at, spending from b.
func (b *budget) node(v any, at string, depth int) error {
	if depth > MaxSchemaDepth {
		return &LimitError{Limit: "schema depth", At: pointer(at), Size: depth, Max: MaxSchemaDepth}
	}
	if err := b.spend(1, at); err != nil {
		return err
	}
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
			if err := b.keyword(k, n[k], at+"/"+pointerEscape(k), depth); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("the schema at %q must be an object or a boolean", pointer(at))
}

// keyword checks the keyword k of a schema object, spending from b.
func (b *budget) keyword(k string, v any, at string, depth int) error {
	if err := b.spend(leafWeight(k, v), at); err != nil {
		return err
	}
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
		return b.node(v, at, depth+1)
	case mapKeywords[k]:
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s at %q must be an object of schemas", k, pointer(at))
		}
		for name, sub := range m {
			if err := b.node(sub, at+"/"+pointerEscape(name), depth+1); err != nil {
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
			if err := b.node(sub, fmt.Sprintf("%s/%d", at, i), depth+1); err != nil {
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

// jsonDepth is the nesting of v, counting no further than MaxJSONDepth+1.
func jsonDepth(v any, d int) int {
	if d > MaxJSONDepth {
		return d
	}
	deepest := d
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			deepest = max(deepest, jsonDepth(x, d+1))
		}
	case []any:
		for _, x := range v {
			deepest = max(deepest, jsonDepth(x, d+1))
		}
	}
	return deepest
}
