package server

import (
	"net/url"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/pki"
)

func TestPrefixQuery(t *testing.T) {
	for _, tc := range []struct {
		in, want, param string
	}{
		{in: "", want: ""},
		{in: "epoch=9c41d2e07a5b3f18&after=42&wait=10", want: "after=42&epoch=9c41d2e07a5b3f18&wait=10"},
		{in: "wait=0.5", want: "wait=0.5"},
		{in: "wait=3600", want: "wait=30"},
		{in: "wait=Inf", want: "wait=30"},
		{in: "epoch=e&other=x", want: "epoch=e"},
		{in: "wait=NaN", param: "wait"},
		{in: "wait=-1", param: "wait"},
		{in: "wait=soon", param: "wait"},
		{in: "after=-1", param: "after"},
		{in: "after=1.5", param: "after"},
	} {
		q, err := url.ParseQuery(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		got, aerr := prefixQuery(q)
		switch {
		case tc.param != "" && (aerr == nil || aerr.Param != tc.param):
			t.Errorf("prefixQuery(%q) = %v, %+v; want an error on %s", tc.in, got, aerr, tc.param)
		case tc.param == "" && (aerr != nil || got.Encode() != tc.want):
			t.Errorf("prefixQuery(%q) = %q, %+v; want %q", tc.in, got.Encode(), aerr, tc.want)
		}
	}
}

// TestWarmHeaders: a warm-up imports a state under the partition its ticket names
// (none: the shared one) and backing the hint's digest.
func TestWarmHeaders(t *testing.T) {
	hint := runnerapi.PeerStateHint{Digest: "00112233aabbccdd"}
	h := warmHeaders(pki.StateTicket{Partition: "team-a", Digest: "00112233aabbccdd"}, hint)
	if h.Get(runnerapi.HeaderCachePartition) != "team-a" || h.Get(runnerapi.HeaderPrefixDigests) != "00112233aabbccdd" {
		t.Fatalf("headers %v, want team-a's partition and the digest", h)
	}
	if h := warmHeaders(pki.StateTicket{}, hint); h.Get(runnerapi.HeaderCachePartition) != "" || len(h.Values(runnerapi.HeaderCachePartition)) != 0 {
		t.Fatalf("a ticket of the shared partition: headers %v, want no partition", h)
	}
}
