// Package speculate holds the decisions of lossless speculative decoding by prompt
// lookup: what a generating slot drafts (the tokens that followed the most recent
// earlier occurrence of its last few tokens), how much it drafts (an adaptive policy
// that backs off while drafts keep failing), and how a decoded draft is verified
// (sample each row with the slot's own sampler, keep the drafted tokens while the
// samples agree). It has no cgo: the engine (metal/runner/server) does the writes.
package speculate

// Lookup is the draft for a slot whose tokens so far (prompt and answer, the token
// about to be decoded last) are hist: it finds the most recent earlier occurrence of
// hist's last n tokens, n from maxN down to minN, and proposes up to k of the tokens
// that followed it, and the n it matched. It returns nil when nothing matches.
func Lookup(hist []int32, minN, maxN, k int) ([]int32, int) {
	if k <= 0 || minN < 1 {
		return nil, 0
	}
	for n := min(maxN, len(hist)-1); n >= minN; n-- {
		tail := hist[len(hist)-n:]
		// Scan back from the latest start that leaves at least one following token.
		for start := len(hist) - n - 1; start >= 0; start-- {
			if !equal(hist[start:start+n], tail) {
				continue
			}
			from := start + n
			return hist[from:min(from+k, len(hist))], n
		}
	}
	return nil, 0
}

// Follow drafts from src, a text the answer is expected to repeat (a request's
// prediction): where the last n tokens of hist (n from maxN down to minN) occur in
// src, latest occurrence first, up to k of the tokens that follow them there, and n.
// Nothing when no tail of hist occurs in src with a token after it.
func Follow(src, hist []int32, minN, maxN, k int) ([]int32, int) {
	if k <= 0 || minN < 1 {
		return nil, 0
	}
	for n := min(maxN, len(hist)); n >= minN; n-- {
		tail := hist[len(hist)-n:]
		for start := len(src) - n - 1; start >= 0; start-- {
			if equal(src[start:start+n], tail) {
				from := start + n
				return src[from:min(from+k, len(src))], n
			}
		}
	}
	return nil, 0
}

func equal(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Verify checks a decoded draft: sample(i) samples output row i (row 0 follows the
// slot's last sampled token, row i+1 follows draft[i]) with the slot's own sampler.
// It samples row 0, and row i+1 only while the token sampled at row i equals
// draft[i]. It returns the sampled tokens, in order: the first len-1 equal the
// accepted draft tokens, the last is the next token. Sampling then comparing is
// exactly lossless for a deterministic draft: the sampler sees the same rows in the
// same order as without the draft, so each token has the target's distribution.
func Verify(draft []int32, sample func(row int) (int32, error)) ([]int32, error) {
	out := make([]int32, 0, len(draft)+1)
	for i := 0; ; i++ {
		tok, err := sample(i)
		if err != nil {
			return out, err
		}
		out = append(out, tok)
		if i == len(draft) || tok != draft[i] {
			return out, nil
		}
	}
}
