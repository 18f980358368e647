package enginepool

// PrefillChunkTokens is the number of prompt tokens the runner decodes per prefill
// batch; the attention scratch of one chunk is what a prefill adds on top of the KV.
const PrefillChunkTokens = 512

// PrefillPeak estimates the memory a prefill of newTokens adds to a loaded model:
//
//	KV(new tokens)    = 2 (K and V) × layers × tokens × KV heads × head dim × KV element size
//	attention scratch = heads × chunk × tokens × 4   (f32 scores of one chunk over the prompt)
//	                  + chunk × embedding × 4 × 8     (f32 hidden states, norms, FFN intermediate)
//	                  + vocab × 4                     (logits of the last position)
//
// with chunk = min(tokens, PrefillChunkTokens) and head dim = embedding / heads. A
// zero KV head count means multi-head attention (KV heads = heads); a zero KV element
// size means f16 (2 bytes). Unknown dimensions (zero layers, heads or embedding) give
// zero: the guard cannot judge such a model and leaves it to the runner's own check.
func PrefillPeak(d ModelDims, newTokens int) int64 {
	if newTokens <= 0 || d.Layers <= 0 || d.Heads <= 0 || d.Embedding <= 0 {
		return 0
	}
	kvHeads := d.KVHeads
	if kvHeads <= 0 {
		kvHeads = d.Heads
	}
	kvSize := d.KVTypeSize
	if kvSize <= 0 {
		kvSize = 2
	}
	headDim := float64(d.Embedding) / float64(d.Heads)
	n := float64(newTokens)
	chunk := float64(min(newTokens, PrefillChunkTokens))
	kv := 2 * float64(d.Layers) * n * float64(kvHeads) * headDim * kvSize
	scores := float64(d.Heads) * chunk * n * 4
	activations := chunk * float64(d.Embedding) * 4 * 8
	logits := float64(max(d.Vocab, 0)) * 4
	return int64(kv + scores + activations + logits)
}

// CheckPrefill is the prefill guard: it returns a *PrefillTooLargeError (413
// prefill_memory_exceeded, with estimated_bytes and limit_bytes) when the host usage
// the enforcer last measured plus the prompt's prefill peak would exceed the hard
// watermark. tokens is the prompt's token count (tokenized by the runner). Call it
// before any byte of the response is written.
func (p *Pool) CheckPrefill(model string, tokens int) error {
	v := p.st.view(query{model: model})
	if !v.found {
		return &UnknownModelError{Model: model}
	}
	spec, current, limit := v.spec, v.usage, v.ceiling.HardBytes
	if v.lastPoll.IsZero() {
		current = p.meter.footprints()
		limit = p.Ceiling().HardBytes
	}
	peak := PrefillPeak(spec.Dims, tokens)
	if current+peak > limit {
		return &PrefillTooLargeError{Model: spec.Name, Tokens: tokens, EstimatedBytes: peak,
			CurrentBytes: current, LimitBytes: limit}
	}
	return nil
}
