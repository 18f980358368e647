package splice

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/gateway/metering"
)

// TestRelayedUsage: a stream that breaks is metered at what the gateway read of it:
// every choice's last count, the prompt when the runner reported it; nothing without
// counts, or with one that is not one.
func TestRelayedUsage(t *testing.T) {
	chunk := func(i, text string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":` + i +
			`,"delta":{"content":"` + text + `"},"finish_reason":null}]}` + "\n\n"
	}
	for _, tc := range []struct {
		name   string
		stream string
		want   metering.Usage
		ok     bool
	}{
		{name: "prompt and two choices", ok: true, want: metering.Usage{Input: 10, Cached: 2, Output: 4 + 2},
			stream: ": prompt 10 2\n: tokens 0 1\n" + chunk("0", "a") + ": tokens 1 2\n" + chunk("1", "b") +
				": tokens 0 4\n" + chunk("0", "c")},
		{name: "no prompt reported: output alone", ok: true, want: metering.Usage{Output: 3},
			stream: ": tokens 0 3\n" + chunk("0", "a")},
		{name: "no counts", stream: chunk("0", "a")},
		{name: "a count that goes down", stream: ": tokens 0 3\n" + chunk("0", "a") + ": tokens 0 1\n" + chunk("0", "b")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := New(Chat)
			r := NewReader(io.NopCloser(strings.NewReader(tc.stream)), st, false)
			_, err := io.ReadAll(r)
			if _, ok := errors.AsType[*Break](err); !ok {
				t.Fatalf("reading the stream: %v, want a break", err)
			}
			got, ok := st.RelayedUsage()
			if ok != tc.ok {
				t.Fatalf("RelayedUsage ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("RelayedUsage (-want +got):\n%s", diff)
			}
		})
	}
}
