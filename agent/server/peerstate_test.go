package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/pki"
)

// peerFleet is a fleet CA, a gateway's certificate and clients of the fleet's
// identities, for the peer fetch tests.
type peerFleet struct {
	t  *testing.T
	ca *pki.CA
	gw *tls.Certificate
}

func newPeerFleet(t *testing.T) *peerFleet {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	gw := pki.Gateway("gw")
	return &peerFleet{t: t, ca: ca, gw: certSource(t, ca, &gw).Certificate()}
}

// ticket is a gateway's ticket for target to fetch digest of model from source, issued
// at issued.
func (f *peerFleet) ticket(target, source, model, digest string, issued time.Time) string {
	f.t.Helper()
	s, err := pki.SignTicket(pki.StateTicket{Target: target, Source: source, Model: model, Digest: digest,
		Issued: issued, Expires: issued.Add(20 * time.Second)}, f.gw)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// client calls the agent of Mac server with id's certificate (none for nil).
func (f *peerFleet) client(id *pki.Identity, server pki.Identity) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = certSource(f.t, f.ca, id).ClientConfig(server)
	f.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestAttackStateFetchWithoutATicket: on the source agent (mac-1), another Mac's
// certificate gets 403 and no byte of a state without a ticket, with another Mac's
// ticket, with an expired one, with one for another digest or model, or with one a Mac
// signed; a gateway's ticket for exactly that state lets it through to the runner.
func TestAttackStateFetchWithoutATicket(t *testing.T) {
	f := newPeerFleet(t)
	me := pki.Node("mac-1")
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	a := startAgent(t, agentOptions{noRunner: true, serverCert: certSource(t, f.ca, &me),
		peers: &server.PeerOptions{Node: "mac-1", Roots: certSource(t, f.ca, nil).Roots, Now: func() time.Time { return *clock.Load() }}})
	mac2, mac3 := pki.Node("mac-2"), pki.Node("mac-3")
	asMac2 := f.client(&mac2, me)
	const digest = "00112233aabbccdd"
	path := "/api/models/tiny/states/" + digest
	fetch := func(c *http.Client, path, ticket string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, a.url+path, nil)
		if ticket != "" {
			req.Header.Set(runnerapi.HeaderPeerTicket, ticket)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	macSigned := func() string {
		s, err := pki.SignTicket(pki.StateTicket{Target: "mac-2", Source: "mac-1", Model: "tiny", Digest: digest,
			Issued: now, Expires: now.Add(20 * time.Second)}, certSource(t, f.ca, &mac3).Certificate())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	for _, tc := range []struct {
		name, path, ticket, refused string
		at                          time.Duration
	}{
		{name: "no ticket", path: path, refused: "no state ticket"},
		{name: "another Mac's ticket", path: path, ticket: f.ticket("mac-3", "mac-1", "tiny", digest, now), refused: `for Mac "mac-3"`},
		{name: "expired", path: path, ticket: f.ticket("mac-2", "mac-1", "tiny", digest, now), at: 21 * time.Second, refused: "expired"},
		{name: "another digest", path: "/api/models/tiny/states/ffffffffffffffff", ticket: f.ticket("mac-2", "mac-1", "tiny", digest, now),
			refused: `for digest "00112233aabbccdd"`},
		{name: "another model", path: "/api/models/other/states/" + digest, ticket: f.ticket("mac-2", "mac-1", "tiny", digest, now),
			refused: `for model "tiny"`},
		{name: "another source", path: path, ticket: f.ticket("mac-2", "mac-9", "tiny", digest, now), refused: `from Mac "mac-9"`},
		{name: "signed by a Mac", path: path, ticket: macSigned, refused: "not a gateway"},
		{name: "the ticket elsewhere", path: "/api/models/tiny/prefixes", ticket: f.ticket("mac-2", "mac-1", "tiny", digest, now),
			refused: "may not call a node agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := now.Add(tc.at)
			clock.Store(&at)
			code, body := fetch(asMac2, tc.path, tc.ticket)
			if code != http.StatusForbidden || !strings.Contains(body, "forbidden_caller") || !strings.Contains(decodeError(t, []byte(body)).Error.Message, tc.refused) {
				t.Fatalf("GET %s as mac-2: %d %s; want 403 forbidden_caller saying %q", tc.path, code, body, tc.refused)
			}
		})
	}
	// The same request with its own ticket passes the check (the model is not loaded
	// here: the pool's answer, not a refusal).
	clock.Store(&now)
	if code, body := fetch(asMac2, path, f.ticket("mac-2", "mac-1", "tiny", digest, now)); code == http.StatusForbidden ||
		!strings.Contains(body, "not loaded") {
		t.Fatalf("GET %s as mac-2 with its ticket: %d %s; want past the check to the pool (model not loaded)", path, code, body)
	}
	if code, _ := fetch(asMac2, path, ""); code != http.StatusForbidden {
		t.Fatalf("without a ticket again: %d, want 403", code)
	}
	// A wrong method on the path is a 405 to a gateway.
	gw := pki.Gateway("gw")
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.url+path, nil)
	resp, err := f.client(&gw, me).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s as a gateway: %d, want 405", path, resp.StatusCode)
	}
}

// fakePeer is another Mac's agent (mac-1) that records the state fetches it gets.
type fakePeer struct {
	url string
	mu  sync.Mutex
	got []string // the Mac of each caller
}

func startFakePeer(t *testing.T, f *peerFleet) *fakePeer {
	me := pki.Node("mac-1")
	p := &fakePeer{}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := pki.PeerIdentity(r.TLS)
		p.mu.Lock()
		p.got = append(p.got, id.Name)
		p.mu.Unlock()
		http.Error(w, `{"error":{"message":"no state","code":"not_found"}}`, http.StatusNotFound)
	}))
	ts.Listener = tls.NewListener(ts.Listener, certSource(t, f.ca, &me).ServerConfig())
	ts.Start()
	t.Cleanup(ts.Close)
	p.url = strings.Replace(ts.URL, "http://", "https://", 1)
	return p
}

func (p *fakePeer) fetches() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}

// TestAttackPeerHintFromATenant: a tenant's ServiceAccount token sending
// X-Macfleet-Peer-State makes the agent fetch nothing (and says nothing of a fetch);
// the same hint from a gateway's certificate makes it call the peer with its own
// Mac's certificate, count the miss and report it on the answer.
func TestAttackPeerHintFromATenant(t *testing.T) {
	f := newPeerFleet(t)
	peer := startFakePeer(t, f)
	me := pki.Node("mac-2")
	const tenantToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZW5hbnQifQ.c2ln"
	src := certSource(t, f.ca, &me)
	a := startAgent(t, agentOptions{serverCert: src,
		peers: &server.PeerOptions{Node: "mac-2", Roots: src.Roots, Transport: pki.NewTransports(src, nil)},
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			if tok == tenantToken {
				return tenancy.Identity{Namespace: "team-b", Name: "system:serviceaccount:team-b:app"}, nil
			}
			return tenancy.Identity{}, &satoken.RefusedError{Reason: "unknown token"}
		}})
	hint, _ := json.Marshal(runnerapi.PeerStateHint{Agent: peer.url, Model: "tiny", Digest: "00112233aabbccdd", Tokens: 512,
		Ticket: f.ticket("mac-2", "mac-1", "tiny", "00112233aabbccdd", time.Now())})
	chat := func(c *http.Client, token string) *http.Response {
		t.Helper()
		b, _ := json.Marshal(chatBody("tiny", 1, false))
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.url+"/v1/chat/completions", strings.NewReader(string(b)))
		req.Header.Set(runnerapi.HeaderPeerState, string(hint))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d %s", resp.StatusCode, body)
		}
		return resp
	}
	resp := chat(f.client(nil, me), tenantToken)
	if got := peer.fetches(); len(got) != 0 {
		t.Fatalf("a tenant's hint made the agent fetch from the peer (callers %v)", got)
	}
	if v := resp.Header.Get(runnerapi.HeaderPeerRestore); v != "" {
		t.Fatalf("a tenant's answer reports a peer fetch: %s", v)
	}
	gw := pki.Gateway("gw")
	resp = chat(f.client(&gw, me), "")
	if got := peer.fetches(); len(got) != 1 || got[0] != "mac-2" {
		t.Fatalf("the gateway's hint: the peer was called by %v, want once by mac-2's certificate", got)
	}
	var res runnerapi.PeerStateResult
	if err := json.Unmarshal([]byte(resp.Header.Get(runnerapi.HeaderPeerRestore)), &res); err != nil || res.Imported ||
		res.Reason != runnerapi.PeerMissNotFound {
		t.Fatalf("%s = %+v (%v), want a not_found miss", runnerapi.HeaderPeerRestore, res, err)
	}
	if got := gathered(t, a, "macfleet_agent_peer_fetches_total", "model", "tiny", "result", runnerapi.PeerMissNotFound); got != 1 {
		t.Errorf("macfleet_agent_peer_fetches_total{model=tiny,result=not_found} = %v, want 1", got)
	}
	st := a.statusAs(f.client(&gw, me))
	if got := st.PeerFetches["tiny"]; got.Results[runnerapi.PeerMissNotFound] != 1 || len(got.Results) != 1 {
		t.Fatalf("/api/status peerFetches[tiny] = %+v, want exactly one not_found", got)
	}
}

// gathered is a counter of a's registry (read directly: its /metrics is behind TLS).
func gathered(t *testing.T, a *testAgent, name string, labels ...string) float64 {
	t.Helper()
	fams, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			if labelsMatch(m, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
