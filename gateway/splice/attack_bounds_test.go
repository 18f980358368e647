package splice

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// endless is a replica's stream that does not end: head once, then body again and
// again, made as it is read (the double holds nothing itself), up to 64 MiB, then EOF
// (so that a reader without bounds ends too, holding all of it).
type endless struct {
	head, body string
	at         int
	read       int64
}

const endlessBytes = 64 << 20

func (e *endless) Read(p []byte) (int, error) {
	if e.read >= endlessBytes {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) {
		var src string
		if e.at < len(e.head) {
			src = e.head[e.at:]
		} else {
			b := e.body
			src = b[(e.at-len(e.head))%len(b):]
		}
		c := copy(p[n:], src)
		n += c
		e.at += c
	}
	e.read += int64(n)
	return n, nil
}

// TestAttackEndlessEvent: a replica streams one event that never ends (data with
// no blank line). On 8cd05e0 the gateway's reader appended it to one buffer until the
// gateway ran out of memory (seen: all 64 MiB the double sent held). Now the stream
// breaks with cause event_too_large once the event passes MaxEventBytes, and the
// reader never held more than that.
func TestAttackEndlessEvent(t *testing.T) {
	src := &endless{head: `data: {"id":"c","choices":[{"index":0,"delta":{"content":"`, body: "aaaaaaaaaaaaaaaa"}
	r := NewReader(io.NopCloser(src), New(Chat), false)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the reader still reads the endless event after %d bytes", src.read)
	}
	brk, ok := errors.AsType[*Break](err)
	t.Logf("read %d bytes of the endless event: %v; the reader holds %d", src.read, err, len(r.event))
	if !ok || brk.Cause() != "event_too_large" {
		t.Errorf("the endless event ended the stream with %v, want a break event_too_large", err)
	}
	if held := len(r.event); held > MaxEventBytes {
		t.Errorf("the reader holds %d bytes of the event, want at most %d", held, MaxEventBytes)
	}
}

// TestAttackEndlessStream: a replica streams content chunks without end. On 8cd05e0
// the gateway kept every chunk's text to continue the stream (seen: 39 MB kept after
// 64 MiB read). Now what it keeps stays within MaxKeptBytes (plus one check's
// interval): past it, it lets the text go and the stream is no longer continued
// (outcome too_long); the chunks still reach the client.
func TestAttackEndlessStream(t *testing.T) {
	chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
		strings.Repeat("x", 200) + `"},"finish_reason":null}]}` + "\n\n"
	src := &endless{head: "", body: chunk}
	st := New(Chat)
	r := NewReader(io.NopCloser(src), st, false)
	buf := make([]byte, 32<<10)
	var relayed, most int64
	for relayed < endlessBytes-int64(len(chunk)) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("reading the stream after %d bytes: %v", relayed, err)
		}
		relayed += int64(n)
		most = max(most, int64(st.Kept()))
	}
	t.Logf("relayed %d bytes; the stream kept at most %d", relayed, most)
	if most > MaxKeptBytes+boundEvery {
		t.Errorf("the stream kept up to %d bytes, want at most %d", most, MaxKeptBytes+boundEvery)
	}
	c := NewContinuation(&Break{cause: "eof"}, st, []byte(`{"model":"m","stream":true,"messages":[]}`), 1, time.Now().Add(time.Minute))
	if ok, why := c.Decide(time.Now()); ok || why != TooLong {
		t.Errorf("Decide = %v, %q, want the stream not continued: %q", ok, why, TooLong)
	}
}
