package enginepool

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// StatusError is implemented by every error the pool returns to a request path. The
// HTTP layer maps it without guessing: HTTPStatus is the response status, Code and
// Type go into the OpenAI error body {"error":{"message","type","code"}}, RetryAfter
// (when positive) becomes a Retry-After header, and Fields are extra members of the
// error object (for example estimated_bytes and limit_bytes of the prefill guard).
type StatusError interface {
	error
	HTTPStatus() int
	Code() string
	Type() string
	RetryAfter() time.Duration
	Fields() map[string]any
}

// AsStatusError finds a StatusError in err's chain.
func AsStatusError(err error) (StatusError, bool) {
	var se StatusError
	if errors.As(err, &se) {
		return se, true
	}
	return nil, false
}

// OpenAI error types used in bodies.
const (
	typeInvalidRequest = "invalid_request_error"
	typeUnavailable    = "service_unavailable"
	typeInsufficient   = "insufficient_storage"
)

// Error codes of the pool's errors.
const (
	CodeModelNotFound         = "model_not_found"
	CodeModelLoading          = "model_loading"
	CodeModelDraining         = "model_draining"
	CodeModelLoadFailed       = "model_load_failed"
	CodeEngineStopped         = "engine_stopped"
	CodePoolClosed            = "pool_closed"
	CodeModelTooLarge         = "model_too_large"
	CodeInsufficientMemory    = "insufficient_memory"
	CodePrefillMemoryExceeded = "prefill_memory_exceeded"
)

// UnknownModelError: no model of that name or alias is registered (404).
type UnknownModelError struct {
	Model string
}

func (e *UnknownModelError) Error() string {
	return fmt.Sprintf("model %q does not exist on this node", e.Model)
}
func (e *UnknownModelError) HTTPStatus() int           { return http.StatusNotFound }
func (e *UnknownModelError) Code() string              { return CodeModelNotFound }
func (e *UnknownModelError) Type() string              { return typeInvalidRequest }
func (e *UnknownModelError) RetryAfter() time.Duration { return 0 }
func (e *UnknownModelError) Fields() map[string]any    { return nil }

// UnavailableError: the model exists but cannot serve right now — it is loading past
// the caller's patience, draining, stopping, in its failure backoff, or its engine
// stopped under a lease (503 + Retry-After, so a gateway retries elsewhere).
type UnavailableError struct {
	Model string
	// State is the entry's state when the request was refused.
	State State
	// ErrCode is one of CodeModelLoading, CodeModelDraining, CodeModelLoadFailed,
	// CodeEngineStopped, CodePoolClosed.
	ErrCode string
	// Reason is a human explanation (the failure reason in backoff, the unload reason).
	Reason string
	Retry  time.Duration
	Err    error
}

func (e *UnavailableError) Error() string {
	msg := fmt.Sprintf("model %q is unavailable (%s)", e.Model, e.State)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Retry > 0 {
		msg += fmt.Sprintf("; retry in %s", e.RetryAfter())
	}
	return msg
}
func (e *UnavailableError) Unwrap() error   { return e.Err }
func (e *UnavailableError) HTTPStatus() int { return http.StatusServiceUnavailable }
func (e *UnavailableError) Code() string    { return e.ErrCode }
func (e *UnavailableError) Type() string    { return typeUnavailable }

// RetryAfter is at least a second, rounded up to whole seconds (the header's unit).
func (e *UnavailableError) RetryAfter() time.Duration {
	if e.Retry < time.Second {
		return time.Second
	}
	return (e.Retry + time.Second - 1).Truncate(time.Second)
}
func (e *UnavailableError) Fields() map[string]any { return nil }

// ModelTooLargeError: the model's estimate exceeds the pool ceiling itself, so no
// eviction can make room (507 model_too_large).
type ModelTooLargeError struct {
	Model          string
	EstimatedBytes int64
	Ceiling        Ceiling
}

func (e *ModelTooLargeError) Error() string {
	return fmt.Sprintf("model %q needs %s but the pool ceiling is %s (%s); fix: %s, or use a smaller quantization, context length or parallel count",
		e.Model, formatBytes(e.EstimatedBytes), formatBytes(e.Ceiling.Bytes), e.Ceiling.Describe(), e.Ceiling.Fix())
}
func (e *ModelTooLargeError) HTTPStatus() int           { return http.StatusInsufficientStorage }
func (e *ModelTooLargeError) Code() string              { return CodeModelTooLarge }
func (e *ModelTooLargeError) Type() string              { return typeInsufficient }
func (e *ModelTooLargeError) RetryAfter() time.Duration { return 0 }
func (e *ModelTooLargeError) Fields() map[string]any {
	return map[string]any{
		"estimated_bytes": e.EstimatedBytes,
		"limit_bytes":     e.Ceiling.Bytes,
		"ceiling_bound":   string(e.Ceiling.Bound),
	}
}

// InsufficientMemoryError: the model fits the ceiling alone but not next to what is
// loaded and cannot be evicted (pinned or busy), or loads are paused under pressure
// (507 insufficient_memory, with a retry hint when the condition is transient).
type InsufficientMemoryError struct {
	Model          string
	EstimatedBytes int64
	// CurrentBytes is max(measured pool footprint, committed reservations) at the
	// decision.
	CurrentBytes int64
	// LimitBytes is what the projection had to stay under (ceiling, or the soft
	// watermark while loads are paused).
	LimitBytes int64
	Ceiling    Ceiling
	// Pressure is the enforcer's level at the decision.
	Pressure PressureLevel
	// Detail says what blocked (pinned/busy models, paused loads).
	Detail string
	Retry  time.Duration
}

func (e *InsufficientMemoryError) Error() string {
	return fmt.Sprintf("cannot load model %q (needs %s): %s in use of a %s limit (pool ceiling %s, %s)%s; fix: unload or unpin a model, wait for busy models to go idle, or %s",
		e.Model, formatBytes(e.EstimatedBytes), formatBytes(e.CurrentBytes), formatBytes(e.LimitBytes),
		formatBytes(e.Ceiling.Bytes), e.Ceiling.Describe(), detailSuffix(e.Detail), e.Ceiling.Fix())
}
func (e *InsufficientMemoryError) HTTPStatus() int           { return http.StatusInsufficientStorage }
func (e *InsufficientMemoryError) Code() string              { return CodeInsufficientMemory }
func (e *InsufficientMemoryError) Type() string              { return typeInsufficient }
func (e *InsufficientMemoryError) RetryAfter() time.Duration { return e.Retry }
func (e *InsufficientMemoryError) Fields() map[string]any {
	return map[string]any{
		"estimated_bytes": e.EstimatedBytes,
		"current_bytes":   e.CurrentBytes,
		"limit_bytes":     e.LimitBytes,
		"ceiling_bound":   string(e.Ceiling.Bound),
	}
}

// PrefillTooLargeError: the prompt's prefill peak would take the host over its hard
// watermark (413 prefill_memory_exceeded), returned before any response byte.
type PrefillTooLargeError struct {
	Model          string
	Tokens         int
	EstimatedBytes int64
	CurrentBytes   int64
	LimitBytes     int64
}

func (e *PrefillTooLargeError) Error() string {
	return fmt.Sprintf("prompt of %d tokens for model %q needs about %s to prefill, and %s in use would exceed the %s hard memory limit; fix: shorten the prompt or retry when the node is less loaded",
		e.Tokens, e.Model, formatBytes(e.EstimatedBytes), formatBytes(e.CurrentBytes), formatBytes(e.LimitBytes))
}
func (e *PrefillTooLargeError) HTTPStatus() int           { return http.StatusRequestEntityTooLarge }
func (e *PrefillTooLargeError) Code() string              { return CodePrefillMemoryExceeded }
func (e *PrefillTooLargeError) Type() string              { return typeInvalidRequest }
func (e *PrefillTooLargeError) RetryAfter() time.Duration { return 0 }
func (e *PrefillTooLargeError) Fields() map[string]any {
	return map[string]any{
		"estimated_bytes": e.EstimatedBytes,
		"limit_bytes":     e.LimitBytes,
	}
}

func detailSuffix(d string) string {
	if d == "" {
		return ""
	}
	return "; " + d
}

// formatBytes renders a byte count in GiB/MiB for messages.
func formatBytes(b int64) string {
	const (
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case b >= gib || b <= -gib:
		return fmt.Sprintf("%.1f GiB", float64(b)/gib)
	case b >= mib || b <= -mib:
		return fmt.Sprintf("%.1f MiB", float64(b)/mib)
	default:
		return fmt.Sprintf("%d B", b)
	}
}
