package gateway

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/prefixdigest"
	"github.com/macfleet/macfleet/gateway/prefixindex/prefixindextest"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// peerAgent is a replica's agent over mutual TLS with its Mac's certificate: it
// reports what its runner holds (held), streams as stream does, holds a request that
// says X-Test-Hold until release, and records the peer hint of each continuation.
type peerAgent struct {
	key    string
	host   string
	events *prefixindextest.Agent
	stream *streamingAgent

	mu      sync.Mutex
	hints   []string // each continuation's runnerapi.HeaderPeerState
	held    chan struct{}
	release chan struct{}
}

func newPeerAgent(t *testing.T, ca *pki.CA, key, mac string, held ...runnerapi.PrefixEvent) *peerAgent {
	t.Helper()
	id := pki.Node(mac)
	certs, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a := &peerAgent{key: key, events: prefixindextest.New(key, "epoch-"+key), held: make(chan struct{}, 1), release: make(chan struct{}),
		stream: &streamingAgent{first: []string{"One"}, rest: []string{", two"}, firstEnd: "engine_stopped", contEnd: "done"}}
	a.events.Publish(held...)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/models/"):
			a.events.Handler().ServeHTTP(w, r)
		case r.URL.Path == pathCancel:
			w.WriteHeader(http.StatusNotFound)
		case r.Header.Get("X-Test-Hold") != "":
			a.held <- struct{}{}
			<-a.release
			okJSON(w, r)
		default:
			if r.Header.Get(runnerapi.HeaderContinue) != "" {
				a.mu.Lock()
				a.hints = append(a.hints, r.Header.Get(runnerapi.HeaderPeerState))
				a.mu.Unlock()
			}
			a.stream.serve(0, w, r)
		}
	}))
	srv.Listener = tls.NewListener(srv.Listener, certs.ServerConfig())
	srv.Start()
	t.Cleanup(srv.Close)
	a.host = strings.TrimPrefix(srv.URL, "http://") // over TLS: the gateway has certificates
	return a
}

func (a *peerAgent) continuations() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.hints...)
}

// TestContinuationPrefersThePrefixAndFetchesFromALivePeer: a continuation is routed
// and hinted as any request of its conversation, the replica it broke on left out of
// both. Replica r0 (mac-a) holds the conversation in its hot tier and r1 (mac-b) on
// its SSD, r2 (mac-c) nothing; the stream goes to r0, which fails mid-answer. Its
// continuation goes to r1, which holds the prefix, and fetches nothing (no live peer
// holds more). With r1's one slot taken it goes to r2, hinted to fetch the prefix
// from r1 (prefill is measured slow) — not from r0, which holds it deepest and hotter
// but just failed: its runner is gone (or its Mac, and the fetch would wait out its
// timeout at the seam). On main that hint named r0.
func TestContinuationPrefersThePrefixAndFetchesFromALivePeer(t *testing.T) {
	body := `{"model":"m","stream":true,"messages":[{"role":"system","content":"You review Go code. ` + strings.Repeat("Be precise. ", 50) +
		`"},{"role":"user","content":"Review main.go"}]}`
	digests := prefixdigest.Of("", "a/m", []byte(body))
	held := func(tier string) []runnerapi.PrefixEvent {
		var ev []runnerapi.PrefixEvent
		for i, d := range digests {
			ev = append(ev, runnerapi.PrefixEvent{Digest: d, Tier: tier, Tokens: 1000 * (i + 1)})
		}
		return ev
	}
	for _, tc := range []struct {
		name         string
		busyHolder   bool
		want         string // the replica that continues it
		wantPeerFrom string // the replica its hint names ("": none)
	}{
		{name: "the holder has room", want: "a/r1"},
		{name: "the holder is full", busyHolder: true, want: "a/r2", wantPeerFrom: "a/r1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, certs := newGatewayCA(t, time.Now())
			agents := []*peerAgent{newPeerAgent(t, ca, "a/r0", "mac-a", held(runnerapi.TierHot)...),
				newPeerAgent(t, ca, "a/r1", "mac-b", held(runnerapi.TierSSD)...), newPeerAgent(t, ca, "a/r2", "mac-c")}
			g := newTestGateway(t, Options{Routing: RoutingPrefixCache, AgentCertificates: certs})
			t.Cleanup(g.Close)
			g.peers.observePrefill("a/m", &metering.Usage{Input: 2100, Cached: 100}, 20*time.Second) // 100 tokens/s
			macs := []string{"mac-a", "mac-b", "mac-c"}
			table := func(only ...int) {
				var rs []mfv1.ModelReplica
				var ns []mfv1.MacNode
				for i, a := range agents {
					if len(only) == 0 || only[0] == i {
						rs = append(rs, replica("a", strings.TrimPrefix(a.key, "a/"), "m", macs[i], a.host, metav1.ConditionTrue))
					}
					ns = append(ns, node(macs[i], metav1.ConditionTrue))
				}
				g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")}, rs, ns))
			}
			done := make(chan struct{})
			if tc.busyHolder { // r1's one slot: a request of the conversation (so r1 was sent its prefix) held there
				table(1)
				go func() {
					defer close(done)
					post(t, g.url, strings.Replace(body, `"stream":true`, `"stream":false`, 1), "X-Test-Hold", "1")
				}()
				<-agents[1].held
			} else {
				close(done)
			}
			table()
			for _, a := range agents[:2] {
				testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
					return g.bal.Index().Len(a.key) == len(digests), "the index learns what " + a.key + " holds"
				})
			}
			if !tc.busyHolder { // r1 was sent the conversation before (peer fetch reads only such)
				g.peers.sent(Backend{Key: "a/r1", Node: "mac-b"}, "", digests...)
			}
			resp, err := http.Post(g.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			got := readClientStream(t, resp)
			resp.Body.Close()
			close(agents[1].release)
			<-done
			if got.text != "One, two" || got.trailer != "1" || got.dones != 1 {
				t.Fatalf("client read %+v, want the answer continued once", got)
			}
			for _, a := range agents {
				hints := a.continuations()
				if a.key != tc.want {
					if len(hints) > 0 {
						t.Errorf("%s took a continuation, want %s", a.key, tc.want)
					}
					continue
				}
				if len(hints) != 1 {
					t.Fatalf("%s took %d continuations, want 1", a.key, len(hints))
				}
				var h runnerapi.PeerStateHint
				if hints[0] != "" {
					if err := json.Unmarshal([]byte(hints[0]), &h); err != nil {
						t.Fatal(err)
					}
				}
				if h.Model != tc.wantPeerFrom {
					t.Errorf("the continuation on %s was hinted to fetch from %q, want %q", a.key, h.Model, tc.wantPeerFrom)
				}
			}
		})
	}
}
