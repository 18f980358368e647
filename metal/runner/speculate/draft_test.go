package speculate

import (
	"strings"
	"testing"
)

type vocab struct {
	bos, eos int32
	texts    []string
	attrs    []uint32
}

func (v vocab) NTokens() int             { return len(v.texts) }
func (v vocab) BOS() int32               { return v.bos }
func (v vocab) EOS() int32               { return v.eos }
func (v vocab) RawText(t int32) string   { return v.texts[t] }
func (v vocab) TokenAttr(t int32) uint32 { return v.attrs[t] }

func TestVocabMismatch(t *testing.T) {
	base := vocab{bos: 0, eos: 1, texts: []string{"<s>", "</s>", "a", "b"}, attrs: []uint32{8, 8, 2, 2}}
	with := func(f func(*vocab)) vocab {
		v := base
		v.texts = append([]string(nil), base.texts...)
		v.attrs = append([]uint32(nil), base.attrs...)
		f(&v)
		return v
	}
	for _, tc := range []struct {
		name  string
		draft vocab
		want  string // a part of the reason; "" for none
	}{
		{"same", with(func(*vocab) {}), ""},
		{"fewer tokens", with(func(v *vocab) { v.texts, v.attrs = v.texts[:3], v.attrs[:3] }), "the draft model has 3 tokens, the model 4"},
		{"another bos", with(func(v *vocab) { v.bos = 2 }), "beginning of sequence is token 2, the model's 0"},
		{"another eos", with(func(v *vocab) { v.eos = 3 }), "end of sequence is token 3, the model's 1"},
		{"another text", with(func(v *vocab) { v.texts[3] = "c" }), `token 3 is "c" in the draft model, "b" in the model`},
		{"another kind", with(func(v *vocab) { v.attrs[1] = 2 }), `token 1 ("</s>") is of kind 0x2 in the draft model, 0x8 in the model`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := VocabMismatch(base, tc.draft)
			if tc.want == "" {
				if got != "" {
					t.Fatalf("VocabMismatch = %q, want none", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) || !strings.Contains(got, "must share the model's vocabulary") {
				t.Fatalf("VocabMismatch = %q, want it to say %q and the fix", got, tc.want)
			}
		})
	}
}
