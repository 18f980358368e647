package runnerapi

// TokenLogprob is a generated token's log-probability under the model (before
// sampling and any grammar), with the most likely alternatives at that position.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// ChatLogprobs are the logprobs of a chat choice or chunk.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
	Refusal []TokenLogprob `json:"refusal"`
}

// TextLogprobs are the logprobs of a text completion choice, in the legacy shape.
type TextLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// TextLogprobsOf converts token logprobs to the legacy shape; offset is the length of
// the text before the first token.
func TextLogprobsOf(lps []TokenLogprob, offset int) *TextLogprobs {
	out := &TextLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, lp := range lps {
		out.Tokens = append(out.Tokens, lp.Token)
		out.TokenLogprobs = append(out.TokenLogprobs, lp.Logprob)
		top := make(map[string]float64, len(lp.TopLogprobs))
		for _, t := range lp.TopLogprobs {
			if _, dup := top[t.Token]; !dup {
				top[t.Token] = t.Logprob
			}
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(lp.Token)
	}
	return out
}
