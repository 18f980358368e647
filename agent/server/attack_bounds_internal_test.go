package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
)

// endlessEvent is a runner's stream of one event that never ends (data and no blank
// line), made as it is read, up to 64 MiB, then EOF: a reader without a bound reads
// and holds all of it.
type endlessEvent struct{ read int64 }

func (e *endlessEvent) Read(p []byte) (int, error) {
	if e.read == 0 && len(p) > 6 {
		e.read = int64(copy(p, "data: "))
		return int(e.read), nil
	}
	if e.read >= 64<<20 {
		return 0, io.EOF
	}
	for i := range p {
		p[i] = 'a'
	}
	e.read += int64(len(p))
	return len(p), nil
}

// TestAttackRunnerEndlessEvent: a runner (a hostile or broken model's) streams one
// event without end. On 8cd05e0 the agent appended it to one buffer as long as it
// came (seen with the bound lifted: all 64 MiB the double sent read as one event), so
// a runner could run the agent, and every replica on its Mac, out of memory. Now the agent stops reading once the event
// passes maxEventBytes and ends the stream with an error event that says so.
func TestAttackRunnerEndlessEvent(t *testing.T) {
	s := &Server{log: logr.Discard(), metrics: newRequestMetrics()}
	src := &endlessEvent{}
	rec := httptest.NewRecorder()
	s.copyStream(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), nil, nil, src,
		proxyRequest{stream: true, served: "m", requested: "m", generates: true})
	body := rec.Body.String()
	t.Logf("the agent read %d bytes of the endless event and answered %q", src.read, body)
	if src.read > maxEventBytes+64<<10 {
		t.Errorf("the agent read %d bytes of one event, want it to stop near %d", src.read, maxEventBytes)
	}
	if !strings.HasPrefix(body, `data: {"error"`) || !strings.Contains(body, "over 4194304 bytes") {
		t.Errorf("the stream ended with %q, want an error event naming the bound", body)
	}
}
