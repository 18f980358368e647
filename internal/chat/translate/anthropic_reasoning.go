package translate

import (
	"bytes"
	"encoding/json"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// thinking maps thinking and output_config onto the chat request's reasoning
// controls: the template's enable_thinking, reasoning_effort (from output_config.effort,
// else from thinking.budget_tokens) and response_format.
func thinking(m *MessagesRequest, chat map[string]any) *chatError {
	effort := ""
	if t := m.Thinking; t != nil {
		switch t.Type {
		case "enabled", "adaptive":
			chat["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
			switch b := t.BudgetTokens; {
			case b <= 0:
			case b < 4096:
				effort = "low"
			case b < 16384:
				effort = "medium"
			default:
				effort = "high"
			}
		case "disabled":
			chat["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
		default:
			return invalid("thinking.type", "thinking type must be enabled, adaptive or disabled, got %q", t.Type)
		}
		if t.Display != "" && t.Display != "summarized" && t.Display != "omitted" {
			return invalid("thinking.display", "thinking display must be summarized or omitted, got %q", t.Display)
		}
	}
	if o := m.OutputConfig; o != nil {
		switch o.Effort {
		case "":
		case "low", "medium", "high":
			effort = o.Effort
		case "max":
			effort = "high"
		default:
			return invalid("output_config.effort", "effort must be low, medium, high or max, got %q", o.Effort)
		}
		if len(o.Format) > 0 && string(bytes.TrimSpace(o.Format)) != "null" {
			var f struct {
				Type   string          `json:"type"`
				Schema json.RawMessage `json:"schema"`
			}
			if err := json.Unmarshal(o.Format, &f); err != nil || f.Type != "json_schema" {
				return invalid("output_config.format", "format must be {\"type\":\"json_schema\",\"schema\":{...}}")
			}
			chat["response_format"] = map[string]any{"type": "json_schema",
				"json_schema": map[string]any{"name": "output", "schema": f.Schema}}
		}
	}
	if effort != "" {
		chat["reasoning_effort"] = effort
	}
	return nil
}

// anyCache reports whether a block carries cache_control.
func anyCache(bs []block) bool {
	for _, b := range bs {
		if len(b.Cache) > 0 {
			return true
		}
	}
	return false
}

// anthropicUsage is a chat usage in Anthropic's terms: input_tokens are the prompt
// tokens that were not read from the prompt cache, cache_read_input_tokens those that
// were (their sum is the prompt); nothing is written to a cache on request.
func anthropicUsage(u *runnerapi.Usage) map[string]any {
	var in, cached, out int
	if u != nil {
		in, out = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			cached = min(u.PromptTokensDetails.CachedTokens, in)
		}
	}
	return map[string]any{"input_tokens": in - cached, "cache_read_input_tokens": cached,
		"cache_creation_input_tokens": 0, "output_tokens": out}
}
