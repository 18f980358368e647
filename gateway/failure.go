package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// failure is an attempt that failed before any byte reached the client, so another
// replica (or the same one later) may still serve the request.
type failure struct {
	backend Backend
	reason  string // connect, transport, status_503, status_507, replica_gone
	status  int    // 0 for a transport error
	header  http.Header
	body    []byte
	err     error
}

// final: a 507 without Retry-After says the model cannot be loaded there; waiting for
// the same replica again does not help.
func (f *failure) final() bool {
	return f.status == http.StatusInsufficientStorage && f.header.Get("Retry-After") == ""
}

// failureMessageLimit bounds the part of a replica's error message a failure's
// description (logs, a held request's 503) repeats.
const failureMessageLimit = 300

// String describes the failure: the transport's error, or the status the replica
// answered with its error's code and message.
func (f *failure) String() string {
	if f.status == 0 {
		return fmt.Sprintf("replica %s at %s: %v", f.backend.Key, f.backend.Endpoint, f.err)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(f.body, &e) == nil && e.Error.Message != "" {
		msg := e.Error.Message
		if len(msg) > failureMessageLimit {
			msg = strings.ToValidUTF8(msg[:failureMessageLimit], "") + "…"
		}
		return fmt.Sprintf("replica %s answered %d (%s): %s", f.backend.Key, f.status, e.Error.Code, msg)
	}
	return fmt.Sprintf("replica %s answered %d", f.backend.Key, f.status)
}

// writeThrough sends an agent's 503/507 answer to the client as it came.
func (f *failure) writeThrough(w http.ResponseWriter) {
	copyResponseHeaders(w.Header(), f.header)
	w.Header().Del("Content-Length")
	w.WriteHeader(f.status)
	_, _ = w.Write(f.body)
}
