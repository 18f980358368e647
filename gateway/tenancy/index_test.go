package tenancy

import (
	"strings"
	"testing"
)

// TestIndexErrors: an index the gateway cannot read is an error naming why, never an
// empty set of keys.
func TestIndexErrors(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"not JSON", `keys`, "the key index: invalid character"},
		{"another format", `{"version":2,"keys":[]}`, "format version 2, this gateway reads 1"},
		{"no version", `{"keys":[]}`, "format version 0"},
		{"an entry with no hash", `{"version":1,"keys":[{"namespace":"a","name":"k"}]}`, "a/k has neither a 32-byte sha256 nor a problem"},
		{"a short hash", `{"version":1,"keys":[{"namespace":"a","name":"k","sha256":"AAAA"}]}`, "a/k has neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := ParseIndex([]byte(tc.data))
			if err == nil {
				_, err = ix.Secrets()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	ix, err := ParseIndex([]byte(`{"version":1,"keys":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := ix.Secrets(); err != nil || len(s) != 0 {
		t.Errorf("an empty index: %d Secrets, %v", len(s), err)
	}
}
