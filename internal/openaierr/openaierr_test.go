package openaierr

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
)

func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        Error
		wantHeader map[string]string
		wantBody   string
	}{
		{
			name:       "retry after rounds up to whole seconds",
			err:        Error{Status: 503, Type: TypeUnavailable, Code: "model_loading", Message: "loading", RetryAfter: 1500 * time.Millisecond},
			wantHeader: map[string]string{"Retry-After": "2", "Content-Type": "application/json", "X-Content-Type-Options": "nosniff"},
			wantBody:   `{"error":{"code":"model_loading","message":"loading","param":null,"type":"service_unavailable"}}`,
		},
		{
			name:       "401 challenges",
			err:        Error{Status: 401, Type: TypeAuthentication, Code: "invalid_api_key", Message: "no key"},
			wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="macfleet"`, "Retry-After": ""},
			wantBody:   `{"error":{"code":"invalid_api_key","message":"no key","param":null,"type":"authentication_error"}}`,
		},
		{
			name: "fields never replace the standard members",
			err: Error{Status: 413, Type: TypeInvalidRequest, Code: "prefill_memory_exceeded", Message: "too big", Param: "messages",
				Fields: map[string]any{"limit_bytes": 7, "code": "overridden"}},
			wantBody: `{"error":{"code":"prefill_memory_exceeded","limit_bytes":7,"message":"too big","param":"messages","type":"invalid_request_error"}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.err.Write(rec)
			if rec.Code != tc.err.Status {
				t.Errorf("status %d, want %d", rec.Code, tc.err.Status)
			}
			for k, v := range tc.wantHeader {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if got := rec.Body.String(); got != tc.wantBody+"\n" {
				t.Errorf("body %s, want %s", got, tc.wantBody)
			}
			if got, want := string(tc.err.SSEEvent()), "data: "+tc.wantBody+"\n\n"; got != want {
				t.Errorf("SSE event %q, want %q", got, want)
			}
		})
	}
}

func TestRecover(t *testing.T) {
	t.Run("before the status: a 500", func(t *testing.T) {
		h := Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }), logr.Discard(), "it was logged")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/x", nil))
		var body map[string]map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		got := map[string]any{"status": rec.Code, "code": body["error"]["code"], "message": body["error"]["message"]}
		want := map[string]any{"status": 500, "code": CodeInternal, "message": "it was logged"}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	})
	t.Run("after the status: the response is aborted", func(t *testing.T) {
		h := Recover(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			panic("boom")
		}), logr.Discard(), "it was logged")
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/x", nil))
	})
}
