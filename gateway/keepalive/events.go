// Package keepalive keeps a streaming request's connection busy while the gateway
// holds it: in the admission queue, through a cold start or a wake of an autoscaled
// deployment, and through a long prefill before the first token. Load balancers
// close a connection on which nothing moved for a while (an AWS ALB after 60 s by
// default, GKE's backends after 30 s); a held stream sends a keep-alive event whenever
// nothing was written for an interval (DefaultInterval), in the API's own form: an SSE
// comment on Chat Completions, text completions and Responses, the "ping" event on
// the Anthropic Messages API.
//
// The first keep-alive commits the response: status 200 and an event stream. An error
// the gateway (or a replica) answers after that can no longer be a status, so Writer
// turns it into the stream's error event in that API's shape (ErrorEvent).
// Non-streaming requests are not touched.
package keepalive

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/macfleet/macfleet/internal/chat/translate"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// DefaultInterval is the longest a held stream stays silent: under the 15 s that
// keeps it open through every common load balancer's idle timeout.
const DefaultInterval = 10 * time.Second

// API is the streaming API of a request, which decides its keep-alive and error
// events.
type API int

const (
	// Chat is Chat Completions and text completions: events are "data:" lines only.
	Chat API = iota
	// Responses is the Responses API: named events carrying a "type".
	Responses
	// Messages is the Anthropic Messages API, which has a ping event of its own.
	Messages
)

// APIOf is the streaming API served at path; ok is false for an endpoint that does
// not stream (embeddings, token counts…).
func APIOf(path string) (api API, ok bool) {
	switch strings.TrimSuffix(path, "/") {
	case "/v1/chat/completions", "/v1/completions":
		return Chat, true
	case "/v1/responses":
		return Responses, true
	case "/v1/messages":
		return Messages, true
	}
	return 0, false
}

// Streaming reports whether a request body asks for a stream ("stream": true).
func Streaming(stream json.RawMessage) bool {
	return string(bytes.TrimSpace(stream)) == "true"
}

// Event is the keep-alive event of api: an SSE comment, which every SSE client skips,
// or the Messages API's ping.
func (api API) Event() []byte {
	if api == Messages {
		return []byte("event: ping\ndata: {\"type\":\"ping\"}\n\n")
	}
	return []byte(": keep-alive\n\n")
}

// ErrorEvent is the last event of a stream whose status was already sent, for an
// answer of status with body (an OpenAI error object, an Anthropic one on Messages,
// or anything else, whose text becomes the message):
//   - Chat: data: {"error":{...}}, as the gateway ends a broken stream;
//   - Responses: event: error with {"type":"error","code","message","param",
//     "sequence_number"};
//   - Messages: event: error with {"type":"error","error":{"type","message"}}.
func (api API) ErrorEvent(status int, body []byte) []byte {
	e := parseError(status, body)
	switch api {
	case Responses:
		var param any
		if e.Param != "" {
			param = e.Param
		}
		b, _ := json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": param,
			"sequence_number": 0})
		return named("error", b)
	case Messages:
		b, ok := translate.AnthropicErrorBody(status, wireBody(e))
		if !ok { // already in the Messages API's shape
			b = compact(body)
		}
		return named("error", b)
	}
	return append(append([]byte("data: "), wireBody(e)...), '\n', '\n')
}

// parseError reads an OpenAI error body; another body (an Anthropic error, plain
// text) keeps what it says as the message.
func parseError(status int, body []byte) *openaierr.Error {
	var wire struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
			Param   any    `json:"param"`
		} `json:"error"`
	}
	e := &openaierr.Error{Status: status, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream}
	if json.Unmarshal(body, &wire) == nil && wire.Error != nil && wire.Error.Message != "" {
		e.Message, e.Type = wire.Error.Message, wire.Error.Type
		if c, ok := wire.Error.Code.(string); ok && c != "" {
			e.Code = c
		}
		if p, ok := wire.Error.Param.(string); ok {
			e.Param = p
		}
		return e
	}
	var anthropic struct {
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &anthropic) == nil && anthropic.Error != nil && anthropic.Error.Message != "" {
		e.Message = anthropic.Error.Message
		return e
	}
	e.Message = strings.TrimSpace(string(body))
	if e.Message == "" {
		e.Message = "the answer ended with status " + strconv.Itoa(status) + " and no body"
	}
	return e
}

// wireBody is e's OpenAI error body on one line.
func wireBody(e *openaierr.Error) []byte {
	b, _ := json.Marshal(e.Body())
	return b
}

// named is an SSE event of the given name carrying data (one line).
func named(event string, data []byte) []byte {
	return append(append([]byte("event: "+event+"\ndata: "), compact(data)...), '\n', '\n')
}

// compact is b on one line when it is JSON, else b with its line breaks dropped.
func compact(b []byte) []byte {
	var out bytes.Buffer
	if json.Compact(&out, b) == nil {
		return out.Bytes()
	}
	return bytes.ReplaceAll(bytes.ReplaceAll(bytes.TrimSpace(b), []byte("\r"), nil), []byte("\n"), []byte(" "))
}
