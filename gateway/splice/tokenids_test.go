package splice

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// idsChunk is a content chunk of choice i.
func idsChunk(i, text string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":` + i +
		`,"delta":{"content":"` + text + `"},"finish_reason":null}]}` + "\n\n"
}

// readBroken reads stream as a replica's part of st (cont: a continuation's) up to
// its break.
func readBroken(t *testing.T, st *Stream, stream string, cont bool) {
	t.Helper()
	_, err := io.ReadAll(NewReader(io.NopCloser(strings.NewReader(stream)), st, cont))
	if _, ok := errors.AsType[*Break](err); !ok {
		t.Fatalf("reading the stream: %v, want a break", err)
	}
	st.Broke("r")
}

// TestSentTokenIDs: the ids the runner names on its count lines are what a
// continuation is told the answer was generated as, across the replicas that wrote
// it; a count line that misses some, or names ones that are not ids, tells none.
func TestSentTokenIDs(t *testing.T) {
	role := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	for _, tc := range []struct {
		name  string
		parts []string // each replica's stream, each broken
		want  string
	}{
		{name: "one replica", want: "5,6,7",
			parts: []string{role + ": tokens 0 1 5\n" + idsChunk("0", "a") + ": tokens 0 3 6,7\n" + idsChunk("0", "bc")}},
		{name: "a count line with no new tokens names none", want: "5,6",
			parts: []string{role + ": tokens 0 2 5,6\n" + idsChunk("0", "a") + ": tokens 0 2\n" + idsChunk("0", "b")}},
		{name: "ids across a continuation", want: "5,6,9,8",
			parts: []string{role + ": tokens 0 2 5,6\n" + idsChunk("0", "ab"),
				role + ": tokens 0 1 9\n" + idsChunk("0", "c") + ": tokens 0 2 8\n" + idsChunk("0", "d")}},
		{name: "a count line without the ids of its tokens",
			parts: []string{role + ": tokens 0 1 5\n" + idsChunk("0", "a") + ": tokens 0 3\n" + idsChunk("0", "bc")}},
		{name: "a count line missing some ids",
			parts: []string{role + ": tokens 0 1 5\n" + idsChunk("0", "a") + ": tokens 0 3 7\n" + idsChunk("0", "bc")}},
		{name: "ids that are not ids",
			parts: []string{role + ": tokens 0 2 5,x\n" + idsChunk("0", "ab")}},
		{name: "a runner that names no ids",
			parts: []string{role + ": tokens 0 2\n" + idsChunk("0", "ab")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := New(Chat)
			for i, p := range tc.parts {
				readBroken(t, st, p, i > 0)
			}
			if got := st.SentTokenIDs(); got != tc.want {
				t.Errorf("SentTokenIDs %q, want %q", got, tc.want)
			}
			if !st.TokensKnown() {
				t.Errorf("the count is not known: the ids must not change it")
			}
		})
	}
}

// TestSentTokenIDsOfAChoice: with n > 1 each choice's continuation is told that
// choice's ids, its continuation's (written as its choice 0) added to them.
func TestSentTokenIDsOfAChoice(t *testing.T) {
	st := New(Chat)
	readBroken(t, st, ": tokens 0 1 5\n"+idsChunk("0", "a")+": tokens 1 2 7,8\n"+idsChunk("1", "bc"), false)
	st.n = 2
	for choice, want := range []string{"5", "7,8"} {
		st.choice = choice
		if got := st.SentTokenIDs(); got != want {
			t.Errorf("choice %d: SentTokenIDs %q, want %q", choice, got, want)
		}
	}
	st.choice = 1
	readBroken(t, st, ": tokens 0 1 9\n"+idsChunk("0", "d"), true)
	if got := st.SentTokenIDs(); got != "7,8,9" {
		t.Errorf("choice 1 continued: SentTokenIDs %q, want %q", got, "7,8,9")
	}
}

// TestSentTokenIDsBounded: the ids told are the first ones that fit in
// runnerapi.MaxContinuedTokenIDsBytes, whole; they count in what the stream keeps,
// and are let go with it past MaxKeptBytes.
func TestSentTokenIDsBounded(t *testing.T) {
	const n = 60000 // "123456," each: over the bound
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = 123456
	}
	st := New(Chat)
	readBroken(t, st, ": tokens 0 60000 "+runnerapi.FormatTokenIDs(ids)+"\n"+idsChunk("0", "a"), false)
	got := st.SentTokenIDs()
	parsed, err := runnerapi.ParseTokenIDs(got)
	if err != nil || len(got) > runnerapi.MaxContinuedTokenIDsBytes || len(parsed) != runnerapi.MaxContinuedTokenIDsBytes/7 {
		t.Fatalf("SentTokenIDs: %d bytes, %d ids (%v), want the first %d within %d bytes",
			len(got), len(parsed), err, runnerapi.MaxContinuedTokenIDsBytes/7, runnerapi.MaxContinuedTokenIDsBytes)
	}
	if kept := st.Kept(); kept < 4*n {
		t.Errorf("Kept %d, want the ids counted (%d)", kept, 4*n)
	}
	st.tokens.ids[0] = make([]int32, MaxKeptBytes/4+1)
	st.bound()
	if !st.Dropped() || st.SentTokenIDs() != "" {
		t.Errorf("past MaxKeptBytes: dropped %v, ids %q; want them let go", st.Dropped(), st.SentTokenIDs())
	}
}
