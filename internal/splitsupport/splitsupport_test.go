package splitsupport

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		arch string
		kind Kind
		want string
	}{
		{"llama", Attention, ""},
		{"qwen3moe", Attention, ""},
		{"gpt-oss", Attention, ""},
		{"gemma3", Attention, ""},
		{"glm4moe", Attention, ""},
		{"", Attention, ""},
		{"qwen3next", Hybrid, "its recurrent layers keep a state beside the attention cache (qwen3next), which split workers do not compute"},
		{"jamba", Hybrid, "its recurrent layers keep a state beside the attention cache (jamba), which split workers do not compute"},
		{"mamba", Recurrent, "its layers keep a recurrent state (mamba), which split workers do not compute"},
		{"rwkv7", Recurrent, "its layers keep a recurrent state (rwkv7), which split workers do not compute"},
		// Names are llama.cpp's exactly: another spelling is another architecture.
		{"Qwen3Next", Attention, ""},
	} {
		if got := KindOf(tc.arch); got != tc.kind {
			t.Errorf("KindOf(%q) = %d, want %d", tc.arch, got, tc.kind)
		}
		if got := Refusal(tc.arch); got != tc.want {
			t.Errorf("Refusal(%q) = %q, want %q", tc.arch, got, tc.want)
		}
	}
}

// TestArchitecturesAreLlamaCpps: the recurrent and hybrid architectures are those of
// llm_arch_is_recurrent and llm_arch_is_hybrid in the vendored llama.cpp, by the names
// its architecture table gives them, so that the control plane refuses the splits the
// runner refuses, and only those.
func TestArchitecturesAreLlamaCpps(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
	if err != nil {
		t.Fatalf("finding the vendored llama.cpp: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "llama", "llama.cpp", "src", "llama-arch.cpp"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	names := map[string]string{}
	for _, m := range regexp.MustCompile(`\{\s*(LLM_ARCH_[A-Z0-9_]+),\s*"([^"]+)"\s*\}`).FindAllStringSubmatch(src, -1) {
		names[m[1]] = m[2]
	}
	for _, tc := range []struct {
		fn   string
		want map[string]bool
	}{{"llm_arch_is_recurrent", recurrent}, {"llm_arch_is_hybrid", hybrid}} {
		at := strings.Index(src, "bool "+tc.fn+"(")
		if at < 0 {
			t.Fatalf("%s not found in llama-arch.cpp", tc.fn)
		}
		body := src[at:]
		body = body[:strings.Index(body, "default:")]
		var got []string
		for _, m := range regexp.MustCompile(`case (LLM_ARCH_[A-Z0-9_]+):`).FindAllStringSubmatch(body, -1) {
			name, ok := names[m[1]]
			if !ok {
				t.Fatalf("%s: %s has no name in the architecture table", tc.fn, m[1])
			}
			got = append(got, name)
		}
		var want []string
		for name := range tc.want {
			want = append(want, name)
		}
		slices.Sort(got)
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s's architectures (-ours +llama.cpp's):\n%s", tc.fn, diff)
		}
	}
}
