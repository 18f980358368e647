package splice

import "testing"

// TestPromptCountRead: the prompt's line is read as the runner writes it; one that is
// not a count of tokens and of cached tokens among them leaves the prompt unknown.
func TestPromptCountRead(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  promptCount
	}{
		{"5 2", promptCount{tokens: 5, cached: 2, known: true}},
		{"5 0\r", promptCount{tokens: 5, known: true}},
		{"0 0", promptCount{known: true}},
		{"5", promptCount{}},
		{"5 6", promptCount{}},
		{"-1 0", promptCount{}},
		{"5 -1", promptCount{}},
		{"x 0", promptCount{}},
		{"5 2 1", promptCount{}},
		{"", promptCount{}},
	} {
		p := promptCount{tokens: 9, cached: 1, known: true} // a line replaces what an earlier one said
		if p.read([]byte(tc.value)); p != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.value, p, tc.want)
		}
	}
}
