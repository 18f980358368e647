package keepalive

import (
	"bytes"
	"mime"
	"net/http"
	"sync"
	"time"
)

// heldErrorLimit bounds what is kept of an error answered after the stream was
// committed (error bodies are one small JSON object).
const heldErrorLimit = 64 << 10

// Writer is the http.ResponseWriter of one held streaming request. It passes the
// handler's answer through, and whenever nothing was written for the interval it
// sends the API's keep-alive event, between two events only (never inside one the
// handler is writing). The first keep-alive commits the response (200, an event
// stream); after that, the handler's own status is dropped when it is a 200 stream,
// and any other answer (an error, or a body that is not a stream) is held and sent
// by Close as the stream's error event (API.ErrorEvent).
//
// Every use of the wrapped writer, from the handler or from the keep-alive loop, takes
// the one lock. Close must be called before the handler returns.
type Writer struct {
	api  API
	stop chan struct{}
	done chan struct{}
	// header is the handler's header map: the wrapped writer's is read only under mu.
	header http.Header

	mu sync.Mutex
	w  http.ResponseWriter
	st state
	// held is the body of an answer turned into an error event, and its status.
	held       []byte
	heldStatus int
	// sent counts the keep-alives sent; ticks the checks made.
	sent, ticks int
}

// New wraps w for a stream of api, sending keep-alives every interval of silence
// until Close. A non-positive interval sends none: w is returned as it is, with a
// Close that does nothing.
func New(w http.ResponseWriter, api API, interval time.Duration) *Writer {
	k := &Writer{api: api, w: w, header: http.Header{}, stop: make(chan struct{}), done: make(chan struct{})}
	if interval <= 0 {
		close(k.done)
		k.st.off = true
		return k
	}
	go k.loop(interval)
	return k
}

// loop checks twice an interval whether the stream was silent since the last check:
// a keep-alive goes out an interval after the last one, and at most an interval
// after the handler's last write.
func (k *Writer) loop(interval time.Duration) {
	defer close(k.done)
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			k.tick()
		}
	}
}

// tick sends a keep-alive if the state says one is due.
func (k *Writer) tick() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ticks++
	act := k.st.tick()
	if act == nothing {
		return
	}
	if act == commitAndSend {
		h := k.w.Header()
		for name, v := range k.header {
			if _, set := h[name]; !set {
				h[name] = v
			}
		}
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		h.Del("Content-Length")
		k.w.WriteHeader(http.StatusOK)
	}
	if _, err := k.w.Write(k.api.Event()); err != nil {
		k.st.off = true // the client is gone: its handler finds out on its own
		return
	}
	_ = http.NewResponseController(k.w).Flush()
	k.sent++
}

// Header is the handler's header map until its status: a map of the Writer's own,
// copied to the response then (a keep-alive may commit the response meanwhile). After
// its status it is the response's own, for trailers (http.TrailerPrefix).
func (k *Writer) Header() http.Header {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.st.status != 0 {
		return k.w.Header()
	}
	return k.header
}

// WriteHeader sends the handler's status, unless a keep-alive already committed one.
func (k *Writer) WriteHeader(code int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writeHeader(code)
}

func (k *Writer) writeHeader(code int) {
	if k.st.status != 0 {
		return
	}
	k.st.status = code
	if !k.st.committed {
		h := k.w.Header()
		for name, v := range k.header {
			h[name] = v
		}
		k.st.stream = code == http.StatusOK && isEventStream(k.header)
		k.w.WriteHeader(code)
		return
	}
	if code != http.StatusOK || !isEventStream(k.header) {
		k.heldStatus = code
		k.st.holding = true
	}
}

// Write sends b, or holds it to be sent as an error event (see Writer).
func (k *Writer) Write(b []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.st.status == 0 {
		k.writeHeader(http.StatusOK)
	}
	if k.st.holding {
		if room := heldErrorLimit - len(k.held); room > 0 {
			k.held = append(k.held, b[:min(len(b), room)]...)
		}
		return len(b), nil
	}
	n, err := k.w.Write(b)
	k.st.wrote(b[:n])
	return n, err
}

// FlushError flushes what was written (nothing while an error is held).
func (k *Writer) FlushError() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.st.holding {
		return nil
	}
	return http.NewResponseController(k.w).Flush()
}

// Flush is FlushError for http.Flusher.
func (k *Writer) Flush() { _ = k.FlushError() }

// Unwrap is the wrapped writer, for http.ResponseController's other methods.
func (k *Writer) Unwrap() http.ResponseWriter { return k.w }

// Close stops the keep-alives and sends a held answer as the stream's error event.
// Nothing is written after it returns.
func (k *Writer) Close() {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	k.mu.Lock()
	defer k.mu.Unlock()
	k.st.off = true
	if !k.st.holding {
		return
	}
	k.st.holding = false
	ev := k.api.ErrorEvent(k.heldStatus, k.held)
	if k.st.midEvent {
		ev = append([]byte("\n\n"), ev...) // end what the handler left open first
	}
	_, _ = k.w.Write(ev)
	_ = http.NewResponseController(k.w).Flush()
}

// KeepAlives is how many keep-alive events were sent.
func (k *Writer) KeepAlives() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sent
}

// Committed reports whether a keep-alive committed the response's status.
func (k *Writer) Committed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st.committed
}

func isEventStream(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "text/event-stream"
}

// action is what a tick of the keep-alive loop does.
type action int

const (
	nothing action = iota
	// send: a keep-alive on the committed stream.
	send
	// commitAndSend: the status and headers of a stream, then a keep-alive.
	commitAndSend
)

// state is what the keep-alive decision reads of the stream (all of it under
// Writer.mu).
type state struct {
	// committed: a keep-alive sent the status; status is the handler's (0: none yet);
	// stream: the handler's status, sent by itself, is a 200 event stream.
	committed bool
	status    int
	stream    bool
	// holding: the handler's answer is held for an error event.
	holding bool
	// active: something was written since the last tick.
	active bool
	// midEvent: what was written ends inside an event; lastNL: it ends with a line
	// break.
	midEvent, lastNL bool
	// off: no more keep-alives (closed, or the client went away).
	off bool
}

// tick is what a tick does, and records it: a keep-alive is due when nothing was
// written since the last tick, between two events, on a response that is still the
// keep-alives' to commit or is a stream.
func (s *state) tick() action {
	wasActive := s.active
	s.active = false
	switch {
	case s.off, s.holding, wasActive, s.midEvent:
		return nothing
	case !s.committed && s.status != 0 && !s.stream:
		return nothing // an answer of the handler's own that is not a stream
	}
	// A keep-alive is activity too: the next is due an interval later, not half.
	s.active = true
	if s.status == 0 && !s.committed {
		s.committed = true
		return commitAndSend
	}
	return send
}

// wrote records b written by the handler.
func (s *state) wrote(b []byte) {
	if len(b) == 0 {
		return
	}
	s.active = true
	if len(b) == 1 {
		s.midEvent = !(b[0] == '\n' && s.lastNL)
	} else {
		s.midEvent = !bytes.HasSuffix(b, []byte("\n\n"))
	}
	s.lastNL = b[len(b)-1] == '\n'
}
