package runnerapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTokenIDsRoundTrip(t *testing.T) {
	for _, ids := range [][]int32{nil, {0}, {1, 2, 3}, {151643, 0, 2147483647}} {
		got, err := ParseTokenIDs(FormatTokenIDs(ids))
		if err != nil {
			t.Fatalf("%v: %v", ids, err)
		}
		if diff := cmp.Diff(ids, got); len(ids) > 0 && diff != "" {
			t.Errorf("%v round trip (-want +got):\n%s", ids, diff)
		}
		if len(ids) == 0 && len(got) != 0 {
			t.Errorf("no ids read back as %v", got)
		}
	}
}

func TestParseTokenIDsRefuses(t *testing.T) {
	for _, s := range []string{"1,", ",1", "1,,2", "-1", "2147483648", "1 2", "a", "1;2"} {
		if ids, err := ParseTokenIDs(s); err == nil {
			t.Errorf("ParseTokenIDs(%q) = %v, want an error", s, ids)
		}
	}
}
