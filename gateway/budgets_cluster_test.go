package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// meteredFleet is a namespace with deployment qwen, whose one replica answers every
// request with a usage of 7 input (2 cached) and 3 output tokens, and a key Secret ci,
// whose key it returns.
func meteredFleet(t *testing.T, e *testenv.Env) (*fleet, string) {
	t.Helper()
	usage := metering.Usage{Input: 7, Cached: 2, Output: 3}.String()
	return reportingFleet(t, e, func(int) string { return usage })
}

// reportingFleet is meteredFleet with a replica whose agent reports the usage of its
// nth answer (from 1) as the metering.Header trailer report(n), whatever the request.
func reportingFleet(t *testing.T, e *testenv.Env, report func(n int) string) (*fleet, string) {
	t.Helper()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1))
		w.Header().Set("Trailer", metering.Header)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
		w.Header().Set(metering.Header, report(n))
	}))
	t.Cleanup(up.Close)
	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	f.deployment("qwen", "qwen", 1)
	f.node("mac-"+f.ns, metav1.ConditionTrue)
	f.replica("qwen-0", "qwen", "mac-"+f.ns)
	f.setReplica("qwen-0", metav1.ConditionTrue, strings.TrimPrefix(up.URL, "http://"))
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte("ledger-key-" + f.ns)}}
	if err := e.Client.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	return f, "ledger-key-" + f.ns
}

// chatBody is the chat completion chatAs sends; chatAsk what it reserves against a
// TokenBudget: its 75 bytes over budget.PromptBytesPerToken, plus one, plus its
// max_tokens.
const (
	chatBody = `{"model":"qwen","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	chatAsk  = 75/2 + 1 + 3
)

func chatAs(g runningGateway, key string) (int, string) {
	return send(http.MethodPost, g.url+"/v1/chat/completions", chatBody, key)
}

// usageRecord waits until the gateway's record of the day in ns counts key ci's
// requests to qwen as want.
func usageRecord(t *testing.T, e *testenv.Env, ns, gw string, requests int64) {
	t.Helper()
	name := ledger.RecordName(gw, time.Now())
	want := mfv1.KeyUsage{Key: "ci", Deployment: ns + "/qwen", Requests: requests, InputTokens: 7 * requests,
		CachedTokens: 2 * requests, OutputTokens: 3 * requests}
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		var tu mfv1.TokenUsage
		if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		return len(tu.Spec.Usage) == 1 && tu.Spec.Usage[0] == want && len(tu.Spec.Windows) == 1 && tu.Spec.Windows[0].Key == "ci",
			fmt.Sprintf("record %s: %+v, want usage %+v", name, tu.Spec, want)
	})
}

// TestLedgerReadBackAfterRestart: a gateway replica that restarts reads its record of
// the day back and counts on, in the record and against a budget: the tokens it
// counted before the restart still fill the key's minute.
func TestLedgerReadBackAfterRestart(t *testing.T) {
	e := cluster(t)
	f, key := meteredFleet(t, e)
	cfg := gateway.Config{TenantKeys: true, GatewayID: "gw-restart"}
	g := startGateway(t, e, cfg)
	// The budget's minute is the one the requests before the restart counted in:
	// they start in a minute's first 30 s.
	testenv.Eventually(t, 40*time.Second, 50*time.Millisecond, func() (bool, string) {
		return time.Now().Second() < 30, "waiting for a minute's first 30 s"
	})
	minute := time.Now().Truncate(time.Minute)
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chatAs(g, key)
		return code == http.StatusOK, fmt.Sprintf("the key's request: %d %s", code, body)
	})
	if code, body := chatAs(g, key); code != http.StatusOK {
		t.Fatalf("the second request: %d %s", code, body)
	}
	usageRecord(t, e, f.ns, "gw-restart", 2)
	g.stop()
	// Room for one more request of chatAsk after the 20 tokens counted, not two.
	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci-minute"},
		Spec: mfv1.TokenBudgetSpec{Key: "ci", TokensPerMinute: ptr.To[int64](25 + chatAsk)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}

	g = startGateway(t, e, cfg)
	code, body := chatAs(g, key)
	if !time.Now().Truncate(time.Minute).Equal(minute) {
		t.Skip("the minute ended during the restart: the budget's minute is not the one counted")
	}
	if code != http.StatusOK {
		t.Fatalf("20 of %d tokens used, the request after the restart: %d %s", 25+chatAsk, code, body)
	}
	usageRecord(t, e, f.ns, "gw-restart", 3)
	if code, body := chatAs(g, key); code != http.StatusTooManyRequests {
		t.Errorf("30 of %d tokens used, 20 of them before the restart: %d %s, want 429", 25+chatAsk, code, body)
	}
}

// TestLedgerAsGateway runs the gateway with --tenant-keys as its own identity, with
// the ClusterRole and admission policies that ship: a team key's answer is written to
// the gateway's usage record of the day in the key's namespace, a TokenBudget created
// while it runs refuses the key within 5 s, and the gateway's identity cannot write a
// record under another replica's name, or one named otherwise than its own.
func TestLedgerAsGateway(t *testing.T) {
	e := cluster(t)
	cfg := asGateway(t, e)
	const id = "gw-ledger"
	g := startGateway(t, e, gateway.Config{RestConfig: cfg, TenantKeys: true, GatewayID: id})
	f, key := meteredFleet(t, e)
	chat := func() (int, string) { return chatAs(g, key) }
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chat()
		return code == http.StatusOK, fmt.Sprintf("the key's request: %d %s", code, body)
	})

	usageRecord(t, e, f.ns, id, 1)
	name := ledger.RecordName(id, time.Now())

	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci-hour"},
		Spec: mfv1.TokenBudgetSpec{Key: "ci", TokensPerHour: ptr.To[int64](10)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chat()
		return code == http.StatusTooManyRequests && strings.Contains(body, "TokenBudget "+f.ns+"/ci-hour allows 10 tokens per hour"),
			fmt.Sprintf("over the budget: %d %s", code, body)
	})

	// The gateway's identity, in its pod, writes only its own records. The API server
	// loads a new admission policy asynchronously: wait for the first denial.
	pod := rest.CopyConfig(cfg)
	pod.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/pod-name": {id}}
	gc, err := client.New(pod, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Format(time.DateOnly)
	record := func(name, gw string) *mfv1.TokenUsage {
		return &mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
			Spec: mfv1.TokenUsageSpec{Gateway: gw, Day: day}}
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := gc.Create(t.Context(), record("gw-other."+day, "gw-other"))
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "gateway pod gw-ledger writes only its own TokenUsage records"),
			fmt.Sprintf("another replica's record: %v, want Forbidden", err)
	})
	if err := gc.Create(t.Context(), record("renamed", id)); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "names its TokenUsage records <spec.gateway>.<spec.day>") {
		t.Errorf("a record not named <gateway>.<day>: %v, want Forbidden", err)
	}
	if err := gc.Patch(t.Context(), record(name, id), client.RawPatch(types.MergePatchType,
		[]byte(`{"spec":{"gateway":"gw-other"}}`))); !apierrors.IsForbidden(err) {
		t.Errorf("its own record moved to another replica: %v, want Forbidden", err)
	}
	// Its own record it may rewrite.
	if err := gc.Patch(t.Context(), record(name, id), client.RawPatch(types.MergePatchType,
		[]byte(`{"spec":{"renewTime":"`+time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")+`"}}`))); err != nil {
		t.Errorf("its own record: %v", err)
	}
}

// TestReservationsCountAcrossGateways: a request held on one gateway replica (its
// deployment has no ready replica yet) reserves 3/4 of the namespace's minute; the
// replica publishes the reservation in its TokenUsage record, and the other replica
// refuses a request of the same size with a 429 naming the reserved tokens. Once the
// held request's client goes away, the record loses the reservation (its window is
// removed, not left as it was); the room the first replica leased for it serves its
// next request, and the other replica is refused naming that lease until the minute
// ends.
func TestReservationsCountAcrossGateways(t *testing.T) {
	e := cluster(t)
	f, key := meteredFleet(t, e)
	f.deployment("held", "", 1)
	f.replica("held-0", "held", "mac-"+f.ns)
	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "team"},
		Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](200)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	f.cleanup(b)
	ga := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: "gw-res-a", ColdStartTimeout: time.Minute})
	gb := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: "gw-res-b", ColdStartTimeout: time.Minute})
	// 80 or 81 bytes: an ask of 41 + 100.
	body := func(model string) string {
		return `{"model":"` + model + `","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, b := send(http.MethodPost, gb.url+"/v1/chat/completions", chatBody, key)
		return code == http.StatusOK, fmt.Sprintf("gateway b serves the key: %d %s", code, b)
	})

	minute := time.Now().UTC().Truncate(time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	held := make(chan struct{})
	go func() {
		defer close(held)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ga.url+"/v1/chat/completions", strings.NewReader(body("held")))
		req.Header.Set("Authorization", "Bearer "+key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the held request was answered %d, want it held until cancelled", resp.StatusCode)
		}
	}()
	reserved(t, e, f.ns, "gw-res-a", func(n int64) bool { return n > 0 })
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, b := send(http.MethodPost, gb.url+"/v1/chat/completions", body("qwen"), key)
		return code == http.StatusTooManyRequests && strings.Contains(b, "are reserved by requests in flight") &&
				!strings.Contains(b, " 0 are reserved"),
			fmt.Sprintf("gateway b while gateway a holds a reservation of 141 of 200: %d %s", code, b)
	})
	cancel()
	<-held
	reserved(t, e, f.ns, "gw-res-a", func(n int64) bool { return n == 0 })
	// Gateway a leased the room its held request needed (both replicas are live);
	// the lease is a's until the minute ends, so the room comes back to a's
	// requests, and b is refused naming the other replica's lease.
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, b := send(http.MethodPost, ga.url+"/v1/chat/completions", body("qwen"), key)
		return code == http.StatusOK, fmt.Sprintf("gateway a once its held request ended: %d %s", code, b)
	})
	code, resp := send(http.MethodPost, gb.url+"/v1/chat/completions", body("qwen"), key)
	switch {
	case !time.Now().UTC().Truncate(time.Minute).Equal(minute):
		t.Logf("the minute of the lease ended before gateway b was asked (%d): its lease ended with it", code)
	case code != http.StatusTooManyRequests || !strings.Contains(resp, "the other gateway replicas used or hold"):
		t.Errorf("gateway b while gateway a holds the minute's lease: %d %s, want the budget's 429 naming the lease", code, resp)
	}
}

// reserved waits until gateway gw's record of the day in ns has key ci's reserved
// tokens satisfy ok (0 when the record has no window of ci).
func reserved(t *testing.T, e *testenv.Env, ns, gw string, ok func(int64) bool) {
	t.Helper()
	name := ledger.RecordName(gw, time.Now())
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		var tu mfv1.TokenUsage
		if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		n := int64(0) // no window of ci: nothing reserved
		for _, w := range tu.Spec.Windows {
			if w.Key == "ci" {
				n = w.ReservedTokens
			}
		}
		return ok(n), fmt.Sprintf("record %s: windows %+v", name, tu.Spec.Windows)
	})
}
