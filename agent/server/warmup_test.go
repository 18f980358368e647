package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/pki"
)

// TestWarmFetchesEachHint: POST /api/models/{id}/states/warm from a gateway makes the
// agent fetch each hint from the peer it names, one after another, with its own Mac's
// certificate, and answer one result per hint; the fetches are counted as peer
// fetches and as warm-ups (metrics and /api/status). Another Mac's certificate gets
// 403 and makes it fetch nothing; an empty or too long list is a 400.
func TestWarmFetchesEachHint(t *testing.T) {
	f := newPeerFleet(t)
	peer := startFakePeer(t, f)
	me := pki.Node("mac-2")
	src := certSource(t, f.ca, &me)
	a := startAgent(t, agentOptions{serverCert: src,
		peers: &server.PeerOptions{Node: "mac-2", Roots: src.Roots, Transport: pki.NewTransports(src, nil)}})
	gw, mac3 := pki.Gateway("gw"), pki.Node("mac-3")
	asGateway := f.client(&gw, me)
	post := func(c *http.Client, hints []runnerapi.PeerStateHint) (int, string) {
		t.Helper()
		b, _ := json.Marshal(runnerapi.PeerWarmRequest{Hints: hints})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.url+"/api/models/tiny/states/warm", strings.NewReader(string(b)))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.url+"/api/models/tiny/load", nil)
	if resp, err := asGateway.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("loading tiny: %v %v", resp, err)
	}
	hint := func(digest string) runnerapi.PeerStateHint {
		return runnerapi.PeerStateHint{Agent: peer.url, Model: "tiny", Digest: digest, Tokens: 512,
			Ticket: f.ticket("mac-2", "mac-1", "tiny", digest, time.Now())}
	}
	hints := []runnerapi.PeerStateHint{hint("00112233aabbccdd"), hint("ffeeddccbbaa9988")}

	if code, body := post(f.client(&mac3, me), hints); code != http.StatusForbidden || !strings.Contains(body, "forbidden_caller") {
		t.Fatalf("a warm-up asked by mac-3's certificate: %d %s; want 403 forbidden_caller", code, body)
	}
	if code, body := post(asGateway, nil); code != http.StatusBadRequest {
		t.Fatalf("no hints: %d %s; want 400", code, body)
	}
	if code, body := post(asGateway, make([]runnerapi.PeerStateHint, runnerapi.MaxWarmHints+1)); code != http.StatusBadRequest {
		t.Fatalf("%d hints: %d %s; want 400", runnerapi.MaxWarmHints+1, code, body)
	}
	if got := peer.fetches(); len(got) != 0 {
		t.Fatalf("refused warm-ups fetched from the peer (callers %v)", got)
	}

	plain := hint("0123456789abcdef")
	plain.Agent = strings.Replace(plain.Agent, "https://", "http://", 1)
	code, body := post(asGateway, append(hints, plain))
	if code != http.StatusOK {
		t.Fatalf("the gateway's warm-up: %d %s", code, body)
	}
	var out runnerapi.PeerWarmResponse
	if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Results) != 3 {
		t.Fatalf("the warm-up's answer %s (%v), want three results", body, err)
	}
	for i, want := range []string{runnerapi.PeerMissNotFound, runnerapi.PeerMissNotFound, runnerapi.PeerMissRefused} {
		if r := out.Results[i]; r.Imported || r.Reason != want {
			t.Errorf("result %d = %+v, want a %s miss", i, r, want)
		}
	}
	if got := peer.fetches(); len(got) != 2 || got[0] != "mac-2" || got[1] != "mac-2" {
		t.Fatalf("the peer was called by %v, want twice by mac-2's certificate (never over plain HTTP)", got)
	}
	for _, name := range []string{"macfleet_agent_peer_warmups_total", "macfleet_agent_peer_fetches_total"} {
		if got := gathered(t, a, name, "model", "tiny", "result", runnerapi.PeerMissNotFound); got != 2 {
			t.Errorf("%s{model=tiny,result=not_found} = %v, want 2", name, got)
		}
	}
	st := a.statusAs(asGateway)
	if got := st.PeerFetches["tiny"]; got.Warmups[runnerapi.PeerMissNotFound] != 2 || got.Results[runnerapi.PeerMissNotFound] != 2 ||
		got.Warmups[runnerapi.PeerMissRefused] != 1 {
		t.Fatalf("/api/status peerFetches[tiny] = %+v, want 2 not_found and 1 refused warm-ups, counted among the results", got)
	}
}

// statusAs is GET /api/status with client c.
func (a *testAgent) statusAs(c *http.Client) server.StatusResponse {
	a.t.Helper()
	req, _ := http.NewRequestWithContext(a.t.Context(), http.MethodGet, a.url+"/api/status", nil)
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		a.t.Fatal(err)
	}
	return st
}
