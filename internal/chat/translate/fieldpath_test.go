package translate

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestUnknownPath(t *testing.T) {
	type inner struct {
		A int `json:"a"`
	}
	type Embedded struct {
		E int `json:"e"`
	}
	type outer struct {
		Embedded
		Items []inner           `json:"items"`
		Ptr   *inner            `json:"ptr"`
		Raw   json.RawMessage   `json:"raw"`
		Map   map[string]inner  `json:"map"`
		Grid  [][]inner         `json:"grid"`
		Any   any               `json:"any"`
		Named int               `json:"named"`
		Skip  int               `json:"-"`
		Bytes []byte            `json:"bytes"`
		Free  map[string]string `json:"free"`
	}
	for _, tc := range []struct {
		body, want string
	}{
		{`{"items":[{"a":1},{"a":2,"b":3}]}`, "items[1].b"},
		{`{"ptr":{"a":1,"z":{}},"x":1}`, "ptr.z"},
		{`{"raw":{"anything":1},"map":{"k":{"q":1}},"any":{"w":1},"free":{"v":"w"},"nope":1}`, "nope"},
		{`{"grid":[[{"a":1}],[{"a":1},{"c":1}]]}`, "grid[1][1].c"},
		{`{"e":1,"NAMED":2,"Items":[]}`, ""},
		{`{"Skip":1}`, "Skip"},
		{`{"items":"not a list","x":1}`, "x"},
	} {
		got, ok := unknownPath([]byte(tc.body), reflect.TypeFor[*outer]())
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: %q %v, want %q", tc.body, got, ok, tc.want)
		}
	}
	if got, _ := unknownPath([]byte(`[{"a":1},{"b":1}]`), reflect.TypeFor[[]inner]()); got != "[1].b" {
		t.Errorf("a list at the root: %q", got)
	}
}
