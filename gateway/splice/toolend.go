package splice

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
)

// A Chat Completions stream that breaks inside or after a tool call is not continued
// (a continuation would have to write the rest of the call's arguments under the
// same grammar from text the gateway only has parsed) but ended cleanly: a last
// chunk with a finish_reason, then [DONE], no error event. The finish_reason is
// tool_calls when every call's arguments the client has are whole JSON (the calls can
// be run), length when the break cut one (a call cut short, as max_tokens cuts one: do
// not run it). A stream that broke after its finish_reason gets [DONE] alone. Either
// is metered by the gateway's count (countedUsage), and with
// stream_options.include_usage gets that usage chunk before [DONE].

// toolCallDelta is what the gateway reads of a tool call's chunk.
type toolCallDelta struct {
	Index    int `json:"index"`
	Function struct {
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// addToolCalls records the arguments of a chunk's tool calls.
func (st *Stream) addToolCalls(raw json.RawMessage) {
	var calls []toolCallDelta
	if json.Unmarshal(raw, &calls) != nil {
		return
	}
	for _, c := range calls {
		if c.Index < 0 || c.Index >= maxCountedChoices {
			continue
		}
		for len(st.args) <= c.Index {
			st.args = append(st.args, nil)
		}
		st.args[c.Index] = append(st.args[c.Index], c.Function.Arguments...)
	}
}

// toolFinish is the finish_reason of a stream that broke after its tool calls: tool_calls
// when each call's arguments are whole JSON, length when one was cut.
func toolFinish(args [][]byte) string {
	for _, a := range args {
		if !json.Valid(a) {
			return "length"
		}
	}
	return "tool_calls"
}

// cleanEnd is the end of a Chat Completions stream that broke after a tool call or its
// finish_reason: its last chunk (none after a finish_reason), the usage chunk when u is
// not nil, and [DONE].
func (st *Stream) cleanEnd(u *metering.Usage) []byte {
	var b strings.Builder
	created := string(st.created)
	if created == "" {
		created = "0"
	}
	id, _ := json.Marshal(st.id)
	model, _ := json.Marshal(st.model)
	head := fmt.Sprintf(`data: {"id":%s,"object":"chat.completion.chunk","created":%s,"model":%s,`, id, created, model)
	if !st.finished {
		fmt.Fprintf(&b, `%s"choices":[{"index":0,"delta":{},"finish_reason":%q}]}`+"\n\n", head, toolFinish(st.args))
	}
	if u != nil {
		ru := runnerapi.Usage{PromptTokens: int(u.Input), CompletionTokens: int(u.Output), TotalTokens: int(u.Input + u.Output)}
		if u.Cached > 0 {
			ru.PromptTokensDetails = &runnerapi.PromptTokensDetails{CachedTokens: int(u.Cached)}
		}
		usage, _ := json.Marshal(ru)
		fmt.Fprintf(&b, `%s"choices":[],"usage":%s}`+"\n\n", head, usage)
	}
	b.WriteString(DoneEvent)
	return []byte(b.String())
}

// countedUsage is the usage of a stream by the gateway's counts: the prompt as its
// last replica reported it, and every completion token the client got; ok false when
// the runner sent either count not (an older one) or not as one.
func (st *Stream) countedUsage() (metering.Usage, bool) {
	if !st.prompt.known || !st.tokens.known() {
		return metering.Usage{}, false
	}
	return metering.Usage{Input: st.prompt.tokens, Cached: st.prompt.cached, Output: st.tokens.total()}, true
}
