package runnerapi

import (
	"bytes"
	"encoding/json"
	"strings"
)

// HeaderSpeculation, set to SpeculationOff, turns speculative decoding (drafts
// verified in the same pass) off for a generation request; SpeculationOn drafts
// wherever a slot's policy finds a draft (prompt lookup, the prediction, a draft
// model), whether or not it pays on this machine; absent (SpeculationAuto), the
// runner drafts only where its own step times say a draft is expected to pay. Any
// way the answer is the same token for token: the header changes only the speed.
// Another value is taken as absent.
const HeaderSpeculation = "X-Macfleet-Speculation"

// The values of HeaderSpeculation.
const (
	SpeculationOff  = "off"
	SpeculationOn   = "on"
	SpeculationAuto = ""
)

// SpeculationMode is the mode a HeaderSpeculation value asks for: SpeculationOff,
// SpeculationOn, or SpeculationAuto for anything else.
func SpeculationMode(v string) string {
	switch v = strings.ToLower(strings.TrimSpace(v)); v {
	case SpeculationOff, SpeculationOn:
		return v
	}
	return SpeculationAuto
}

// PathSpeculation is speculative decoding: a model whose sequences cannot be cut
// back by a rejected draft's tokens (a recurrent state) is served without it.
const PathSpeculation Path = "speculation"

// DraftStatus is the draft model in /status: a smaller model of the same vocabulary
// whose greedy tokens the slots draft where prompt lookup finds nothing.
type DraftStatus struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
	// Drafted is the tokens it has drafted, Kept those the model's own sampling
	// agreed with (they are in the answers).
	Drafted int64 `json:"drafted"`
	Kept    int64 `json:"kept"`
	// HeadBytes is the memory of the draft's greedy head, its copy of the output
	// matrix: a draft on the CPU with a q8_0 output matrix takes each greedy token
	// from its hidden state in one fused pass instead of a row of logits. 0 when the
	// draft reads its logits (on an accelerator, or another type of matrix).
	HeadBytes int64 `json:"head_bytes,omitempty"`
	// Device is where the draft computes: CPU, or the accelerator's name (CUDA0,
	// MTL0). Placement says how it was chosen (--draft-device; beside a model on an
	// accelerator the runner times a step of the draft on both and keeps the shorter,
	// whose times are CPUStepSeconds and AcceleratorStepSeconds, absent when not timed).
	Device                 string  `json:"device"`
	Placement              string  `json:"placement"`
	CPUStepSeconds         float64 `json:"cpu_step_seconds,omitempty"`
	AcceleratorStepSeconds float64 `json:"accelerator_step_seconds,omitempty"`
}

// CompletionTokensDetails is OpenAI's breakdown of the completion tokens: of the
// tokens speculative decoding drafted, those the model's own sampling agreed with
// (accepted) and those it did not (rejected; they are not in the answer and not
// counted as completion tokens).
type CompletionTokensDetails struct {
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

// PredictedContent is the text of a chat request's prediction (OpenAI's predicted
// outputs: {"type": "content", "content": a string or text parts}), "" for none.
func PredictedContent(raw json.RawMessage) (string, *Error) {
	if len(bytes.TrimSpace(raw)) == 0 || isNull(raw) {
		return "", nil
	}
	var p struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Type != "content" {
		return "", InvalidRequest(CodeInvalidValue, "prediction", `prediction must be {"type": "content", "content": ...}`)
	}
	var text string
	if err := json.Unmarshal(p.Content, &text); err == nil {
		return text, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(p.Content, &parts); err != nil {
		return "", InvalidRequest(CodeInvalidValue, "prediction.content", "prediction.content must be a string or an array of text parts")
	}
	var b strings.Builder
	for i, part := range parts {
		if part.Type != "text" {
			return "", InvalidRequest(CodeInvalidValue, "prediction.content", "prediction.content[%d] must be a text part, got type %q", i, part.Type)
		}
		b.WriteString(part.Text)
	}
	return b.String(), nil
}
