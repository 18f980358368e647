package modelsource

import (
	"errors"
	"testing"
)

// FuzzParse: any string either fails with a *ParseError or parses into a source
// whose canonical spelling parses again into the same source.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"hf://Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m.gguf", "hf://org/repo/m.gguf@refs/pr/3",
		"ollama://team/model:v1", "ollama://llama3.2", "https://example.test/a%20b/m.gguf?x=1#f",
		"http://[::1]:8080/m.gguf", "file:///models/a%20b.gguf", "file://host/x.gguf", "HF://o/r/x.GGUF", "",
		"hf://o/r/m-00001-of-00002.gguf", "file:///m/x-00002-of-00003.gguf", "https://h/a-00001-of-00009.gguf?q",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Error() == "" {
				t.Fatalf("Parse(%q) = %v, want a *ParseError with a message", in, err)
			}
			return
		}
		canon := s.String()
		again, err := Parse(canon)
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, but its canonical spelling %q does not parse: %v", in, s, canon, err)
		}
		s.Raw, again.Raw = "", ""
		if s != again {
			t.Fatalf("Parse(%q) = %+v; its canonical spelling %q parses into %+v", in, s, canon, again)
		}
	})
}
