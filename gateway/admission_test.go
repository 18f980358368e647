package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// gatedReplica is an agent with one sequence slot that records the order requests
// reach it (by their X-Test-Tag) and answers each only when the test lets it.
type gatedReplica struct {
	*upstream
	mu      sync.Mutex
	arrived []string
	gate    chan struct{}
}

func newGatedReplica(t *testing.T) *gatedReplica {
	g := &gatedReplica{gate: make(chan struct{})}
	g.upstream = newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.arrived = append(g.arrived, r.Header.Get("X-Test-Tag"))
		g.mu.Unlock()
		select {
		case <-g.gate:
			okJSON(w, r)
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(g.gate) })
	return g
}

func (g *gatedReplica) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.arrived...)
}

// waitArrived waits until n requests reached the replica.
func (g *gatedReplica) waitArrived(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		got := g.order()
		return len(got) == n, fmt.Sprintf("%d of %d requests reached the replica: %v", len(got), n, got)
	})
}

// keysGateway is a gateway with API keys a, b and c (c limited to batch) in front of
// one gated replica.
func keysGateway(t *testing.T, opts Options) (*testGateway, *gatedReplica) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("key-a\nkey-b priority=interactive\nkey-c priority=batch\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kf, err := LoadKeysFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Identify = kf.Identify
	g := newTestGateway(t, opts)
	rep := newGatedReplica(t)
	g.serveReplicas(rep.host())
	return g, rep
}

// waitQueued waits until the queue holds n requests of priority p.
func (g *testGateway) waitQueued(t *testing.T, p fairqueue.Priority, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		got := testutil.ToFloat64(g.metrics.queueDepth.WithLabelValues("a/m", p.String()))
		return got == float64(n), fmt.Sprintf("%v %s requests queued, want %d", got, p, n)
	})
}

func send(t *testing.T, g *testGateway, key, tag string, hdr ...string) <-chan answer {
	t.Helper()
	return sendAsync(t, g.url, "/v1/chat/completions", chatBody,
		append([]string{"Authorization", "Bearer " + key, "X-Test-Tag", tag}, hdr...)...)
}

func wantOK(t *testing.T, chs map[string]<-chan answer) {
	t.Helper()
	for tag, ch := range chs {
		select {
		case a := <-ch:
			if a.code != http.StatusOK {
				t.Errorf("%s: %d %s", tag, a.code, a.body)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: no answer", tag)
		}
	}
}

// TestFairQueue: with the replica's one slot busy, requests wait in the gateway, and a
// client with one request is served after one request of a client with many, not
// after all of them; interactive requests go before batch ones, a key limited to
// batch stays batch whatever it asks for.
func TestFairQueue(t *testing.T) {
	g, rep := keysGateway(t, Options{})
	chs := map[string]<-chan answer{"a1": send(t, g, "key-a", "a1")}
	rep.waitArrived(t, 1)
	for i := 2; i <= 5; i++ {
		tag := fmt.Sprintf("a%d", i)
		chs[tag] = send(t, g, "key-a", tag)
		g.waitQueued(t, fairqueue.Interactive, i-1)
	}
	chs["b1"] = send(t, g, "key-b", "b1")
	g.waitQueued(t, fairqueue.Interactive, 5)
	if got := rep.order(); len(got) != 1 {
		t.Fatalf("the replica got %v with its one slot busy", got)
	}
	for range 6 {
		rep.gate <- struct{}{}
	}
	wantOK(t, chs)
	if d := cmp.Diff([]string{"a1", "a2", "b1", "a3", "a4", "a5"}, rep.order()); d != "" {
		t.Errorf("order the replica served (-want +got):\n%s", d)
	}

	// Priorities: c is limited to batch even when it asks for interactive; b asks for
	// batch once.
	rep.mu.Lock()
	rep.arrived = nil
	rep.mu.Unlock()
	// The gateway releases the last request's slot just after its client has the
	// answer: a6 must find the slot free, not wait for it.
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		n := g.bal.Outstanding("a/r0")
		return n == 0, fmt.Sprintf("%d requests still counted on the replica", n)
	})
	chs = map[string]<-chan answer{"a6": send(t, g, "key-a", "a6")}
	rep.waitArrived(t, 1)
	chs["c1"] = send(t, g, "key-c", "c1", HeaderPriority, "interactive")
	g.waitQueued(t, fairqueue.Batch, 1)
	chs["b2"] = send(t, g, "key-b", "b2", HeaderPriority, "batch")
	g.waitQueued(t, fairqueue.Batch, 2)
	chs["b3"] = send(t, g, "key-b", "b3")
	g.waitQueued(t, fairqueue.Interactive, 1)
	for range 4 {
		rep.gate <- struct{}{}
	}
	wantOK(t, chs)
	if d := cmp.Diff([]string{"a6", "b3", "c1", "b2"}, rep.order()); d != "" {
		t.Errorf("order with priorities (-want +got):\n%s", d)
	}
	for p, want := range map[fairqueue.Priority]uint64{fairqueue.Interactive: 5 + 1, fairqueue.Batch: 2} {
		var m dto.Metric
		if err := g.metrics.queueWait.WithLabelValues("a/m", p.String()).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if n := m.GetHistogram().GetSampleCount(); n != want {
			t.Errorf("%d %s queue waits observed, want %d", n, p, want)
		}
		if d := testutil.ToFloat64(g.metrics.queueDepth.WithLabelValues("a/m", p.String())); d != 0 {
			t.Errorf("%s queue depth %v after every request was served", p, d)
		}
	}
	// The handler releases the replica just after the client has its answer.
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		n := g.bal.Outstanding("a/r0")
		return n == 0, fmt.Sprintf("%d requests outstanding on the replica after all ended", n)
	})

	resp, body := post(t, g.url, chatBody, "Authorization", "Bearer key-a", HeaderPriority, "urgent")
	if e := decodeErr(t, body); resp.StatusCode != 400 || e.Error.Code != openaierr.CodeInvalidValue ||
		!strings.Contains(e.Error.Message, "X-Macfleet-Priority") || !strings.Contains(e.Error.Message, "interactive or batch") {
		t.Errorf("unknown priority: %d %s", resp.StatusCode, body)
	}
}

// TestQueueFull: a full queue answers 429 with Retry-After in the API's own error
// shape, and a client at its own limit is told so while others still get in.
func TestQueueFull(t *testing.T) {
	g, rep := keysGateway(t, Options{Queue: fairqueue.Limits{MaxQueued: 2, MaxPerFlow: 1}})
	chs := map[string]<-chan answer{"a1": send(t, g, "key-a", "a1")}
	rep.waitArrived(t, 1)
	chs["a2"] = send(t, g, "key-a", "a2")
	g.waitQueued(t, fairqueue.Interactive, 1)

	a3 := <-send(t, g, "key-a", "a3")
	var e errBody
	if err := json.Unmarshal([]byte(a3.body), &e); err != nil || a3.code != http.StatusTooManyRequests ||
		e.Error.Code != codeQueueFull || e.Error.Type != typeRateLimit || !strings.Contains(e.Error.Message, "this client") {
		t.Errorf("a client over its share: %d %s", a3.code, a3.body)
	}
	chs["b1"] = send(t, g, "key-b", "b1")
	g.waitQueued(t, fairqueue.Interactive, 2)

	c1 := <-send(t, g, "key-c", "c1")
	if err := json.Unmarshal([]byte(c1.body), &e); err != nil || c1.code != http.StatusTooManyRequests ||
		e.Error.Code != codeQueueFull || !strings.Contains(e.Error.Message, "overloaded") {
		t.Errorf("a full queue: %d %s", c1.code, c1.body)
	}
	for _, a := range []answer{a3, c1} {
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
			t.Errorf("Retry-After %q, want 1..60 seconds", a.header.Get("Retry-After"))
		}
	}
	// Anthropic clients get the same refusal in their API's shape.
	m := <-sendAsync(t, g.url, "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
		"X-Api-Key", "key-c")
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(m.body), &ae); err != nil || m.code != 429 || ae.Type != "error" || ae.Error.Type != "rate_limit_error" {
		t.Errorf("Anthropic Messages on a full queue: %d %s", m.code, m.body)
	}

	for range 3 {
		rep.gate <- struct{}{}
	}
	wantOK(t, chs)
	for reason, want := range map[string]float64{"queue_full_client": 1, "queue_full": 2} {
		var got float64
		for _, p := range fairqueue.Priorities {
			got += testutil.ToFloat64(g.metrics.queueRejected.WithLabelValues("a/m", p.String(), reason))
		}
		if got != want {
			t.Errorf("rejections %s = %v, want %v", reason, got, want)
		}
	}
}

// TestQueueTimeoutAndLeaving: a request that waits longer than the gateway's timeout
// gets a 503 saying every replica stayed busy; a client that goes away leaves the
// queue, and the one after it gets the slot.
func TestQueueTimeoutAndLeaving(t *testing.T) {
	g, rep := keysGateway(t, Options{ColdStartTimeout: time.Second})
	first := send(t, g, "key-a", "a1")
	rep.waitArrived(t, 1)
	late := <-send(t, g, "key-b", "b1")
	if e := decodeErr(t, late.body); late.code != 503 || e.Error.Code != codeQueueTimeout ||
		!strings.Contains(e.Error.Message, "stayed busy") || late.header.Get("Retry-After") == "" {
		t.Errorf("a request that waited too long: %d %v %s", late.code, late.header, late.body)
	}
	if got := testutil.ToFloat64(g.metrics.queueRejected.WithLabelValues("a/m", "interactive", "queue_timeout")); got != 1 {
		t.Errorf("queue_timeout rejections = %v, want 1", got)
	}

	req, cancel := cancellable(t, g.url, "key-b", "gone")
	g.waitQueued(t, fairqueue.Interactive, 1)
	next := send(t, g, "key-c", "c1")
	g.waitQueued(t, fairqueue.Batch, 1)
	cancel()
	<-req
	g.waitQueued(t, fairqueue.Interactive, 0)
	rep.gate <- struct{}{} // a1 ends: c1 takes the slot
	rep.gate <- struct{}{}
	wantOK(t, map[string]<-chan answer{"a1": first, "c1": next})
	if d := cmp.Diff([]string{"a1", "c1"}, rep.order()); d != "" {
		t.Errorf("served (-want +got):\n%s", d)
	}
}

// cancellable sends a request the test can cancel; the channel closes when it ended.
func cancellable(t *testing.T, url, key, tag string) (<-chan struct{}, func()) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Test-Tag", tag)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req.WithContext(ctx)); err == nil {
			resp.Body.Close()
			t.Errorf("the cancelled request was answered %d", resp.StatusCode)
		}
	}()
	return done, cancel
}

// TestQueueWakesAutoscaler: requests queued because every replica of an autoscaled
// deployment is busy ask its autoscaler for one more (one wake write for all of them),
// and not once it is at maxReplicas.
func TestQueueWakesAutoscaler(t *testing.T) {
	for _, tt := range []struct {
		name      string
		max       int32
		wantWakes int
	}{{"below maxReplicas", 3, 1}, {"at maxReplicas", 1, 0}} {
		t.Run(tt.name, func(t *testing.T) {
			k := &wakes{}
			g := newTestGateway(t, Options{Wake: k.wake})
			rep := newGatedReplica(t)
			d := deployment("a", "m", "")
			d.Spec.Replicas = ptr.To[int32](1)
			d.Spec.Autoscaling = &mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: tt.max}
			g.SetTable(BuildTable([]mfv1.ModelDeployment{d},
				[]mfv1.ModelReplica{replica("a", "r0", "m", "mac", rep.host(), metav1.ConditionTrue)},
				[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
			chs := map[string]<-chan answer{"1": sendAsync(t, g.url, "/v1/chat/completions", chatBody, "X-Test-Tag", "1")}
			rep.waitArrived(t, 1)
			for i := 2; i <= 4; i++ {
				chs[strconv.Itoa(i)] = sendAsync(t, g.url, "/v1/chat/completions", chatBody, "X-Test-Tag", strconv.Itoa(i))
			}
			g.waitQueued(t, fairqueue.Interactive, 3)
			if tt.wantWakes > 0 {
				testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
					return k.count() == tt.wantWakes, fmt.Sprintf("%d wakes", k.count())
				})
			}
			for range 4 {
				rep.gate <- struct{}{}
			}
			wantOK(t, chs)
			if c := k.count(); c != tt.wantWakes {
				t.Errorf("%d wake writes for 3 queued requests, want %d: %v", c, tt.wantWakes, k.calls)
			}
		})
	}
}

func TestKeysFileAttributes(t *testing.T) {
	ks, err := parseKeys([]byte("# team keys\nk1\nk2  priority=batch\n\tk3 priority=Interactive\n"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]fairqueue.Priority{"k1": fairqueue.Interactive, "k2": fairqueue.Batch, "k3": fairqueue.Interactive} {
		if _, ok := ks[sha256.Sum256([]byte(key))]; !ok {
			t.Errorf("%s not accepted", key)
		}
		if got := ks[sha256.Sum256([]byte(key))].priority; got != want {
			t.Errorf("%s: priority %v, want %v", key, got, want)
		}
	}
	_, attr := ks[sha256.Sum256([]byte("priority=batch"))]
	_, whole := ks[sha256.Sum256([]byte("k2  priority=batch"))]
	if attr || whole {
		t.Error("an attribute was taken for a key")
	}
	for in, want := range map[string]string{
		"k1\nk2 priority=urgent\n": "line 2: priority=: unknown priority \"urgent\"",
		"k1 owner=me\n":            "line 1: unknown attribute \"owner\"",
	} {
		if _, err := parseKeys([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseKeys(%q) error = %v, want it to contain %q", in, err, want)
		}
	}
}

// TestGrantWhileAway: a request granted a replica while it was handling a table change
// gets that replica when it asks again, instead of queueing a second time (which
// leaked the room and let a second grant block the dispatcher).
func TestGrantWhileAway(t *testing.T) {
	g := newTestGateway(t, Options{})
	g.serveReplicas("10.0.0.1:8080")
	rt := g.Table().Route("a/m")
	tickets := make([]*admission.Ticket, 3)
	for i := range tickets {
		tickets[i] = g.adm.NewTicket(admission.Request{Model: "a/m", Flow: fmt.Sprint("client", i), Priority: fairqueue.Interactive})
	}
	first, ok, aerr := g.adm.Acquire(rt, tickets[0])
	if !ok || aerr != nil {
		t.Fatalf("the first request: %v %v", ok, aerr)
	}
	for _, tk := range tickets[1:] {
		if _, ok, aerr := g.adm.Acquire(rt, tk); ok || aerr != nil {
			t.Fatalf("a request placed with the one slot busy: %v %v", ok, aerr)
		}
	}
	g.adm.Release(tickets[0], first.Key) // the slot goes to tickets[1], which is elsewhere
	be, ok, aerr := g.adm.Acquire(rt, tickets[1])
	if !ok || aerr != nil || be.Key != "a/r0" {
		t.Fatalf("asking again after a grant: %v %v %v, want the granted replica", be, ok, aerr)
	}
	if n := g.bal.Outstanding("a/r0"); n != 1 {
		t.Errorf("%d requests counted on the replica, want 1", n)
	}
	done := make(chan struct{})
	go func() {
		g.adm.Release(tickets[1], be.Key) // the slot goes to tickets[2]
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatcher blocked")
	}
	if got := <-tickets[2].Granted(); got.Key != "a/r0" {
		t.Errorf("the last request was granted %v", got)
	}
	g.adm.Release(tickets[2], "a/r0")
	for _, tk := range tickets {
		g.adm.Leave(tk)
	}
	if n := g.bal.Outstanding("a/r0"); n != 0 {
		t.Errorf("%d requests counted after all left", n)
	}
}
