package runnerapi

// HeaderSpeculation, set to SpeculationOff, turns speculative decoding (prompt
// lookup drafts verified in the same pass) off for a generation request; absent or
// SpeculationOn, the runner drafts where its adaptive policy finds it pays. Either
// way the answer is the same token for token: the header changes only the speed.
// Another value is taken as SpeculationOn.
const HeaderSpeculation = "X-Macfleet-Speculation"

// The values of HeaderSpeculation.
const (
	SpeculationOff = "off"
	SpeculationOn  = "on"
)

// PathSpeculation is speculative decoding: a model whose sequences cannot be cut
// back by a rejected draft's tokens (a recurrent state) is served without it.
const PathSpeculation Path = "speculation"

// CompletionTokensDetails is OpenAI's breakdown of the completion tokens: of the
// tokens speculative decoding drafted, those the model's own sampling agreed with
// (accepted) and those it did not (rejected; they are not in the answer and not
// counted as completion tokens).
type CompletionTokensDetails struct {
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}
