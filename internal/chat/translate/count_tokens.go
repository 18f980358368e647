package translate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// AnthropicCountTokens serves POST /v1/messages/count_tokens: the request (a Messages
// request; max_tokens may be left out) is translated into a chat completion request,
// which count answers with {"prompt_tokens": N} — the prompt as the model's chat
// template renders it, tokenized — or an OpenAI error; the answer is
// {"input_tokens": N}.
func AnthropicCountTokens(count http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, chatReq, ok := readMessages(w, r, func(m *MessagesRequest) (map[string]any, []string, *chatError) {
			m.Stream = false
			return chatFromMessagesBody(m, 1)
		})
		if !ok {
			return
		}
		delete(chatReq, "max_tokens")
		b, _ := json.Marshal(chatReq)
		sub := r.Clone(r.Context())
		sub.Body = io.NopCloser(bytes.NewReader(b))
		sub.ContentLength = int64(len(b))
		sub.Header.Set("Content-Length", strconv.Itoa(len(b)))
		sub.Header.Set("Content-Type", "application/json")
		cw := &bufferWriter{header: http.Header{}}
		count.ServeHTTP(cw, sub)
		if cw.status == 0 {
			cw.status = http.StatusOK
		}
		var out struct {
			PromptTokens *int `json:"prompt_tokens"`
		}
		switch {
		case cw.status != http.StatusOK:
			anthropicError(w, parseError(cw.status, cw.buf.Bytes()))
		case json.Unmarshal(cw.buf.Bytes(), &out) != nil || out.PromptTokens == nil:
			anthropicError(w, &chatError{Status: http.StatusBadGateway, Type: "api_error", Message: "the token count did not decode"})
		default:
			writeJSON(w, http.StatusOK, map[string]int{"input_tokens": *out.PromptTokens})
		}
	})
}

// bufferWriter is a ResponseWriter that keeps the status and body.
type bufferWriter struct {
	header http.Header
	status int
	buf    bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.header }

func (b *bufferWriter) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.buf.Write(p)
}
