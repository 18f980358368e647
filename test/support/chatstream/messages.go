package chatstream

// MessagesEvent is what tests read of an Anthropic Messages stream event: its type,
// block index, delta's type and text, and the output tokens of its usage.
type MessagesEvent struct {
	Type  string `json:"type"`
	Index *int   `json:"index"`
	Delta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}
