package launchd

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Parse reads an XML property list whose top value is a dictionary, with the value
// types Render writes: dict (map[string]any), array ([]any), string, integer (int64),
// true and false (bool).
func Parse(data []byte) (map[string]any, error) {
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = true
	start, err := nextStart(d)
	if err != nil {
		return nil, err
	}
	if start.Name.Local != "plist" {
		return nil, fmt.Errorf("plist: root element <%s>, want <plist>", start.Name.Local)
	}
	v, err := parseValue(d)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("plist: top value is %T, want a dict", v)
	}
	return m, nil
}

// nextStart skips to the next start element; io.ErrUnexpectedEOF at the end.
func nextStart(d *xml.Decoder) (xml.StartElement, error) {
	for {
		tok, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return xml.StartElement{}, fmt.Errorf("plist: %w", err)
		}
		if s, ok := tok.(xml.StartElement); ok {
			return s, nil
		}
	}
}

// errEnd says parseValue met an end element instead of a value.
var errEnd = errors.New("end of container")

// parseValue reads the next value, or returns errEnd at its container's end element.
func parseValue(d *xml.Decoder) (any, error) {
	start, err := nextValueStart(d)
	if err != nil {
		return nil, err
	}
	switch start.Name.Local {
	case "string", "integer", "key":
		return parseText(d, start)
	case "true", "false":
		if err := d.Skip(); err != nil {
			return nil, fmt.Errorf("plist: %w", err)
		}
		return start.Name.Local == "true", nil
	case "array":
		return parseArray(d)
	case "dict":
		return parseDict(d)
	default:
		return nil, fmt.Errorf("plist: unsupported element <%s>", start.Name.Local)
	}
}

// nextValueStart skips to the start element of the next value, or returns errEnd at
// its container's end element.
func nextValueStart(d *xml.Decoder) (xml.StartElement, error) {
	for {
		tok, err := d.Token()
		if err != nil {
			return xml.StartElement{}, fmt.Errorf("plist: %w", err)
		}
		if _, ok := tok.(xml.EndElement); ok {
			return xml.StartElement{}, errEnd
		}
		if s, ok := tok.(xml.StartElement); ok {
			return s, nil
		}
	}
}

// parseText reads a <string>, <integer> or <key> element whose start was read.
func parseText(d *xml.Decoder, start xml.StartElement) (any, error) {
	var text string
	if err := d.DecodeElement(&text, &start); err != nil {
		return nil, fmt.Errorf("plist: <%s>: %w", start.Name.Local, err)
	}
	if start.Name.Local == "integer" {
		n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("plist: <integer>%s: %w", text, err)
		}
		return n, nil
	}
	if start.Name.Local == "key" {
		return key(text), nil
	}
	return text, nil
}

// parseArray reads an array's values up to its end element.
func parseArray(d *xml.Decoder) (any, error) {
	arr := []any{}
	for {
		v, err := parseValue(d)
		if errors.Is(err, errEnd) {
			return arr, nil
		}
		if err != nil {
			return nil, err
		}
		if k, ok := v.(key); ok {
			return nil, fmt.Errorf("plist: <key>%s</key> in an array", k)
		}
		arr = append(arr, v)
	}
}

// parseDict reads a dict's key and value pairs up to its end element.
func parseDict(d *xml.Decoder) (any, error) {
	m := map[string]any{}
	for {
		k, err := parseValue(d)
		if errors.Is(err, errEnd) {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		name, ok := k.(key)
		if !ok {
			return nil, fmt.Errorf("plist: dict entry %v without a <key>", k)
		}
		v, err := parseValue(d)
		if err != nil {
			if errors.Is(err, errEnd) {
				return nil, fmt.Errorf("plist: key %q without a value", name)
			}
			return nil, err
		}
		if k, ok := v.(key); ok {
			return nil, fmt.Errorf("plist: key %q followed by <key>%s</key>", name, k)
		}
		if _, dup := m[string(name)]; dup {
			return nil, fmt.Errorf("plist: key %q twice", name)
		}
		m[string(name)] = v
	}
}

// key is a dict key, told apart from a string value.
type key string
