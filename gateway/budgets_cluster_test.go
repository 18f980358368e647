package gateway_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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
	"github.com/macfleet/macfleet/internal/testenv"
	"github.com/macfleet/macfleet/ledger"
	"github.com/macfleet/macfleet/metering"
	"github.com/macfleet/macfleet/tenancy"
)

// TestLedgerAsGateway runs the gateway with --tenant-keys as its own identity, with
// the ClusterRole and admission policies that ship: a team key's answer is written to
// the gateway's usage record of the day in the key's namespace, a TokenBudget created
// while it runs refuses the key within 5 s, and the gateway's identity cannot write a
// record under another replica's name, or one named otherwise than its own.
func TestLedgerAsGateway(t *testing.T) {
	e := cluster(t)
	cfg := asGateway(t, e)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", metering.Header)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
		w.Header().Set(metering.Header, metering.Usage{Input: 7, Cached: 2, Output: 3}.String())
	}))
	defer up.Close()
	const id = "gw-ledger"
	g := startGateway(t, e, gateway.Config{RestConfig: cfg, TenantKeys: true, GatewayID: id})

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	f.deployment("qwen", "qwen", 1)
	f.node("mac-"+f.ns, metav1.ConditionTrue)
	f.replica("qwen-0", "qwen", "mac-"+f.ns)
	f.setReplica("qwen-0", metav1.ConditionTrue, strings.TrimPrefix(up.URL, "http://"))
	const key = "ledger-key-0123456789abcdef"
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	if err := e.Client.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	chat := func() (int, string) {
		return send(http.MethodPost, g.url+"/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`, key)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chat()
		return code == http.StatusOK, fmt.Sprintf("the key's request: %d %s", code, body)
	})

	name := ledger.RecordName(id, time.Now())
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		var tu mfv1.TokenUsage
		if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		want := mfv1.KeyUsage{Key: "ci", Deployment: f.ns + "/qwen", Requests: 1, InputTokens: 7, CachedTokens: 2, OutputTokens: 3}
		ok := len(tu.Spec.Usage) == 1 && tu.Spec.Usage[0] == want && len(tu.Spec.Windows) == 1 &&
			tu.Spec.Windows[0].Key == "ci" && tu.Spec.Windows[0].MinuteTokens+tu.Spec.Windows[0].HourTokens >= 20
		return ok, fmt.Sprintf("record %s: %+v", name, tu.Spec)
	})

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
