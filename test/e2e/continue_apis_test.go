package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/test/support/chatstream"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// apiStreams is how many streams of one API TestTranslatedStreamsSurviveARunnerKill
// sends at once: more than both replicas' slots, so the victim writes some.
const apiStreams = 24

// apiTokens is each stream's cap on its output.
const apiTokens = 400

// TestTranslatedStreamsSurviveARunnerKill: Responses streams (read by the official
// OpenAI client) and Anthropic Messages streams (read event by event) through the
// gateway to a two-replica deployment, one replica's runner killed with SIGKILL while
// they stream: every stream completes as an uninterrupted one does, those the failed
// replica was writing continued on the other replica with the stream's own ids,
// sequence numbers and content block, one terminal event and one usage.
func TestTranslatedStreamsSurviveARunnerKill(t *testing.T) {
	t.Run("responses", func(t *testing.T) { surviveWith(t, apiStreams, responsesStream, killRunner, 3, nil) })
	t.Run("messages", func(t *testing.T) { surviveWith(t, apiStreams, messagesStream, killRunner, 3, nil) })
}

// responsesStream streams one Responses answer with the official client and checks
// its events: sequence numbers 0, 1, 2, … without a gap, response.created first and
// one terminal event last, one response id and one message item throughout, the done
// events' text the deltas', and the usage within max_output_tokens.
func responsesStream(ctx context.Context, model string, i int, streaming *atomic.Int32) streamResult {
	var hr *http.Response
	c := gatewayClient()
	stream := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: model,
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("Story %d: tell me a very long story about the sea.", i))},
		MaxOutputTokens: openai.Int(apiTokens), Temperature: openai.Float(0)}, option.WithResponseInto(&hr))
	defer stream.Close()
	var (
		kinds       []string
		deltas      strings.Builder
		ids, items  = map[string]bool{}, map[string]bool{}
		final       *responses.Response
		doneText    string
		problem     string
		counted     bool
		seq         int64
		terminalSeq = -1
	)
	for stream.Next() {
		ev := stream.Current()
		kinds = append(kinds, ev.Type)
		if ev.SequenceNumber != seq && problem == "" {
			problem = fmt.Sprintf("event %d (%s) has sequence number %d", seq, ev.Type, ev.SequenceNumber)
		}
		seq++
		if ev.ItemID != "" {
			items[ev.ItemID] = true
		}
		switch ev.Type {
		case "response.created", "response.in_progress":
			ids[ev.Response.ID] = true
		case "response.output_item.added", "response.output_item.done":
			items[ev.Item.ID] = true
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
			if !counted {
				counted = true
				streaming.Add(1)
			}
		case "response.output_text.done":
			doneText = ev.Text
		case "response.completed", "response.incomplete":
			r := ev.Response
			final, terminalSeq = &r, int(seq-1)
			ids[r.ID] = true
		case "error", "response.failed":
			problem = fmt.Sprintf("%s event: %s", ev.Type, ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		return streamResult{err: err.Error()}
	}
	res := streamResult{}
	if hr != nil {
		res.continued = hr.Trailer.Get("X-Macfleet-Continued")
	}
	switch {
	case problem != "":
		res.err = problem
	case len(kinds) < 3 || kinds[0] != "response.created" || final == nil || terminalSeq != len(kinds)-1:
		res.err = fmt.Sprintf("events %v: want response.created first and one terminal event last", kinds)
	case len(ids) != 1 || len(items) != 1:
		res.err = fmt.Sprintf("response ids %v, items %v: want one each", ids, items)
	case deltas.Len() == 0 || doneText != deltas.String() || final.OutputText() != deltas.String():
		res.err = fmt.Sprintf("deltas %q, output_text.done %q, the response's text %q", deltas.String(), doneText, final.OutputText())
	case final.Usage.OutputTokens == 0 || final.Usage.OutputTokens > apiTokens || final.Usage.InputTokens == 0:
		res.err = fmt.Sprintf("usage %+v (continued %q)", final.Usage, res.continued)
	}
	return res
}

// messagesStream streams one Anthropic Messages answer and checks its events in
// order: message_start, one text block at index 0 (start, deltas, stop), then
// message_delta with the usage and message_stop, nothing after; pings anywhere.
func messagesStream(ctx context.Context, model string, i int, streaming *atomic.Int32) streamResult {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"temperature":0,
		"messages":[{"role":"user","content":"Story %d: tell me a very long story about the sea."}]}`, model, apiTokens, i)
	resp, problem := postStream(ctx, "/v1/messages", body)
	if problem != "" {
		return streamResult{err: problem}
	}
	defer resp.Body.Close()
	var kinds []string
	var output int
	counted := false
	br := bufio.NewReader(resp.Body)
	for event := ""; ; {
		line, err := br.ReadString('\n')
		if err != nil {
			if line != "" {
				return streamResult{err: fmt.Sprintf("stream cut in an event: %q, %v", line, err)}
			}
			break
		}
		line = strings.TrimSuffix(line, "\n")
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			event = v
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			if line != "" {
				return streamResult{err: fmt.Sprintf("line %q", line)}
			}
			continue
		}
		var e chatstream.MessagesEvent
		if err := json.Unmarshal([]byte(data), &e); err != nil || e.Type != event {
			return streamResult{err: fmt.Sprintf("event %q: %s (%v)", event, data, err)}
		}
		if e.Index != nil && *e.Index != 0 {
			return streamResult{err: fmt.Sprintf("%s at index %d: want one block at 0", e.Type, *e.Index)}
		}
		switch e.Type {
		case "ping":
			continue
		case "content_block_delta":
			if e.Delta.Type != "text_delta" {
				return streamResult{err: "delta " + data}
			}
			if !counted {
				counted = true
				streaming.Add(1)
			}
		case "message_delta":
			output = e.Usage.OutputTokens
		}
		if k := len(kinds); k == 0 || kinds[k-1] != e.Type || e.Type != "content_block_delta" {
			kinds = append(kinds, e.Type)
		}
	}
	res := streamResult{continued: resp.Trailer.Get("X-Macfleet-Continued")}
	want := "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
	switch {
	case strings.Join(kinds, " ") != want:
		res.err = fmt.Sprintf("events %v, want %s (repeated deltas as one)", kinds, want)
	case output == 0 || output > apiTokens:
		res.err = fmt.Sprintf("output_tokens %d (continued %q), want 1 to %d", output, res.continued, apiTokens)
	}
	return res
}
