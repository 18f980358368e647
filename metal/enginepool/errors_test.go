package enginepool

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Every error of a request path carries its HTTP status, OpenAI code and retry hint,
// also when wrapped.
func TestErrorsMapToHTTP(t *testing.T) {
	c := ComputeCeiling(Hardware{TotalBytes: 64 * gib}, 10*gib, 0, 0, 0)
	for _, tc := range []struct {
		err    error
		status int
		code   string
		retry  time.Duration
	}{
		{&UnknownModelError{Model: "x"}, http.StatusNotFound, CodeModelNotFound, 0},
		{&UnavailableError{Model: "x", State: StateDraining, ErrCode: CodeModelDraining}, http.StatusServiceUnavailable, CodeModelDraining, time.Second},
		{&UnavailableError{Model: "x", State: StateFailed, ErrCode: CodeModelLoadFailed, Retry: 8 * time.Second}, http.StatusServiceUnavailable, CodeModelLoadFailed, 8 * time.Second},
		{&ModelTooLargeError{Model: "x", EstimatedBytes: 11 * gib, Ceiling: c}, http.StatusInsufficientStorage, CodeModelTooLarge, 0},
		{&InsufficientMemoryError{Model: "x", Ceiling: c, Retry: 5 * time.Second}, http.StatusInsufficientStorage, CodeInsufficientMemory, 5 * time.Second},
		{&PrefillTooLargeError{Model: "x", EstimatedBytes: 1, LimitBytes: 2}, http.StatusRequestEntityTooLarge, CodePrefillMemoryExceeded, 0},
	} {
		t.Run(fmt.Sprintf("%T/%s", tc.err, tc.code), func(t *testing.T) {
			wrapped := fmt.Errorf("proxying: %w", tc.err)
			se, ok := AsStatusError(wrapped)
			if !ok {
				t.Fatal("not found through wrapping")
			}
			if se.HTTPStatus() != tc.status || se.Code() != tc.code || se.RetryAfter() != tc.retry || se.Type() == "" || se.Error() == "" {
				t.Fatalf("got %d %s retry %s type %q", se.HTTPStatus(), se.Code(), se.RetryAfter(), se.Type())
			}
		})
	}
	if _, ok := AsStatusError(errors.New("plain")); ok {
		t.Fatal("a plain error is not a StatusError")
	}
}

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }
