package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// A Chat Completions stream that breaks inside or after a tool call is not continued
// (a continuation would have to write the rest of the call's arguments under the
// same grammar from text the gateway only has parsed) but ended cleanly: a last
// chunk with a finish_reason, then [DONE], no error event. The finish_reason is
// tool_calls when every call's arguments the client has are whole JSON (the calls can
// be run), length when the break cut one (a call cut short, as max_tokens cuts one: do
// not run it). A stream that broke after its finish_reason gets [DONE] alone.

// toolCallDelta is what the gateway reads of a tool call's chunk.
type toolCallDelta struct {
	Index    int `json:"index"`
	Function struct {
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// addToolCalls records the arguments of a chunk's tool calls.
func (st *spliced) addToolCalls(raw json.RawMessage) {
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
// finish_reason: its last chunk (none after a finish_reason) and [DONE].
func (st *spliced) cleanEnd() []byte {
	var b strings.Builder
	if !st.finished {
		created := string(st.created)
		if created == "" {
			created = "0"
		}
		id, _ := json.Marshal(st.id)
		model, _ := json.Marshal(st.model)
		fmt.Fprintf(&b, `data: {"id":%s,"object":"chat.completion.chunk","created":%s,"model":%s,`+
			`"choices":[{"index":0,"delta":{},"finish_reason":%q}]}`+"\n\n", id, created, model, toolFinish(st.args))
	}
	b.WriteString(doneEvent)
	return []byte(b.String())
}

// endCleanly ends a Chat Completions stream that broke after a tool call or its
// finish_reason (see cleanEnd).
func (g *Gateway) endCleanly(w http.ResponseWriter, model string, be Backend, c continuation, why string) outcome {
	g.log.Info("Upstream stream broke after a tool call or its finish; ended cleanly", "model", model,
		"replica", be.Key, "endpoint", be.Endpoint, "err", c.brk.Error(), "why", why)
	_, _ = w.Write(c.st.cleanEnd())
	_ = http.NewResponseController(w).Flush()
	return outcome{status: http.StatusOK, reason: "stream_broken"}
}
