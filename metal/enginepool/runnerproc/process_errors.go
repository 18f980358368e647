package runnerproc

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// ErrRunnerExited is returned (wrapped) by control calls to a runner whose process has
// exited.
var ErrRunnerExited = errors.New("runner process has exited")

// RunnerPhase says when a runner failed.
type RunnerPhase string

const (
	// PhaseStart: the process could not be started or never announced its socket.
	PhaseStart RunnerPhase = "start"
	// PhaseLoad: the runner failed to load its model, or exited while loading.
	PhaseLoad RunnerPhase = "load"
	// PhaseExit: the runner exited without being asked to.
	PhaseExit RunnerPhase = "exit"
)

// RunnerError reports a runner that could not start, failed to load its model or
// exited unexpectedly, with what the runner itself said about it.
type RunnerError struct {
	Model string
	// PID is the runner's process id, 0 when it never started.
	PID   int
	Phase RunnerPhase
	// ExitCode is the exit status; -1 when the process was killed by a signal or had
	// not exited when the error was made.
	ExitCode int
	// Signal names the signal that killed the process, e.g. "killed".
	Signal string
	// Message is the runner's own explanation: the /health error of a failed load, or
	// the last line it wrote to stderr.
	Message string
	// Stderr is the tail of the runner's stderr.
	Stderr string
	Err    error
}

func (e *RunnerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "runner for model %q", e.Model)
	if e.PID > 0 {
		fmt.Fprintf(&b, " (pid %d)", e.PID)
	}
	switch e.Phase {
	case PhaseStart:
		b.WriteString(" failed to start")
	case PhaseLoad:
		b.WriteString(" failed to load the model")
	default:
		b.WriteString(" exited")
	}
	switch {
	case e.Signal != "":
		fmt.Fprintf(&b, ": signal %s", e.Signal)
	case e.ExitCode >= 0:
		fmt.Fprintf(&b, ": exit status %d", e.ExitCode)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	return b.String()
}

func (e *RunnerError) Unwrap() error { return e.Err }

// RunnerHTTPError is a non-2xx answer of a runner to a control call, with the fields of
// its OpenAI-shaped error body.
type RunnerHTTPError struct {
	StatusCode int
	Type       string
	Code       string
	Message    string
}

func (e *RunnerHTTPError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if e.Code != "" {
		return fmt.Sprintf("runner answered %d (%s): %s", e.StatusCode, e.Code, msg)
	}
	return fmt.Sprintf("runner answered %d: %s", e.StatusCode, msg)
}

// tailBuffer keeps the first and the last lines written to it (a runner's first
// error is often followed by a long trace or usage text), each cut to a maximum length.
type tailBuffer struct {
	mu      sync.Mutex
	head    []string
	tail    []string
	dropped int
	maxHead int
	maxTail int
	maxLine int
}

func newTailBuffer(maxHead, maxTail, maxLine int) *tailBuffer {
	return &tailBuffer{maxHead: maxHead, maxTail: maxTail, maxLine: maxLine}
}

func (t *tailBuffer) add(line string) {
	if len(line) > t.maxLine {
		line = line[:t.maxLine] + "…"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.head) < t.maxHead {
		t.head = append(t.head, line)
		return
	}
	if len(t.tail) == t.maxTail {
		t.tail = append(t.tail[:0], t.tail[1:]...)
		t.dropped++
	}
	t.tail = append(t.tail, line)
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := slices.Clone(t.head)
	if t.dropped > 0 {
		lines = append(lines, fmt.Sprintf("… (%d lines)", t.dropped))
	}
	return strings.Join(append(lines, t.tail...), "\n")
}

// errorWords mark the stderr line most likely to say why a runner failed.
var errorWords = []string{"error", "fail", "fatal", "panic", "invalid", "flag provided", "cannot", "unable"}

// message is the last line that reads like an error, else the last non-blank line;
// with first, the first non-blank line.
func (t *tailBuffer) message(first bool) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := append(slices.Clone(t.head), t.tail...)
	if first {
		for _, l := range lines {
			if s := strings.TrimSpace(l); s != "" {
				return s
			}
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.ToLower(lines[i])
		for _, w := range errorWords {
			if strings.Contains(l, w) {
				return strings.TrimSpace(lines[i])
			}
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(lines[i]); s != "" {
			return s
		}
	}
	return ""
}
