package sandbox

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOtherParts(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  []string
	}{
		{"/s/parts/ab/tiny-00001-of-00003.gguf", []string{"/s/parts/ab/tiny-00002-of-00003.gguf", "/s/parts/ab/tiny-00003-of-00003.gguf"}},
		{"/m/Qwen3-8B-Q4_K_M-00001-of-00002.gguf", []string{"/m/Qwen3-8B-Q4_K_M-00002-of-00002.gguf"}},
		// One file, a later part (the runner loads from the first only), a single
		// "part", and names the runner would not look its parts up by: nothing.
		{"/s/blobs/sha256-ab", nil},
		{"/m/tiny.gguf", nil},
		{"/m/tiny-00002-of-00003.gguf", nil},
		{"/m/tiny-00001-of-00001.gguf", nil},
		{"/m/tiny-00001-OF-00003.GGUF", nil},
		{"/m/tiny-00000-of-00003.gguf", nil},
	} {
		if diff := cmp.Diff(tc.want, OtherParts(tc.model)); diff != "" {
			t.Errorf("OtherParts(%s) (-want +got):\n%s", tc.model, diff)
		}
	}
}
