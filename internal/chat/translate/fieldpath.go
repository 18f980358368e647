package translate

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// unknownPath is the JSON path ("tools[10].defer_loading") of the first field of body,
// in document order, that a value of type t does not decode: encoding/json's
// DisallowUnknownFields names only the key, not where it is. Keys match field names
// as encoding/json matches them (exactly, else case-insensitively); values decoded as
// a whole (json.RawMessage, maps, interfaces, types with their own UnmarshalJSON) are
// not looked into. ok is false when every field is known.
func unknownPath(body []byte, t reflect.Type) (path string, ok bool) {
	return walkUnknown(json.NewDecoder(bytes.NewReader(body)), t, "")
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// walkUnknown reads the next value of dec as one of type t, found at path.
func walkUnknown(dec *json.Decoder, t reflect.Type, path string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return "", false
	}
	delim, composite := tok.(json.Delim)
	if !composite {
		return "", false
	}
	whole := reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
	switch {
	case delim == '{' && t.Kind() == reflect.Struct && !whole:
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return "", false
			}
			key, _ := k.(string)
			at := key
			if path != "" {
				at = path + "." + key
			}
			f, found := jsonField(t, key)
			if !found {
				return at, true
			}
			if p, found := walkUnknown(dec, f, at); found {
				return p, true
			}
		}
	case delim == '[' && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() != reflect.Uint8 && !whole:
		for i := 0; dec.More(); i++ {
			if p, found := walkUnknown(dec, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); found {
				return p, true
			}
		}
	default:
		for depth := 1; depth > 0; {
			tok, err := dec.Token()
			if err != nil {
				return "", false
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				depth++
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
		return "", false
	}
	_, _ = dec.Token() // the closing delimiter
	return "", false
}

// jsonField is the type of the field of struct t that decodes key (embedded structs'
// fields included).
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	var fold reflect.Type
	var walk func(t reflect.Type) (reflect.Type, bool)
	walk = func(t reflect.Type) (reflect.Type, bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
				continue
			case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
				if ft, ok := walk(f.Type); ok {
					return ft, true
				}
				continue
			case !f.IsExported():
				continue
			case name == "":
				name = f.Name
			}
			if name == key {
				return f.Type, true
			}
			if fold == nil && strings.EqualFold(name, key) {
				fold = f.Type
			}
		}
		return nil, false
	}
	if ft, ok := walk(t); ok {
		return ft, true
	}
	return fold, fold != nil
}
