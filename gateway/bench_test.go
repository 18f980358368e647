package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/test/support/otlptest"
)

// benchSetup is a trivial upstream (a fixed small chat completion) and a gateway over
// real loopback HTTP in front of it, with a client transport that keeps connections.
type benchSetup struct {
	direct, gateway string
	client          *http.Client
}

func newBenchSetup(b *testing.B, affinity bool) benchSetup {
	b.Helper()
	up := newBenchUpstream(b)
	return benchSetup{direct: up, gateway: newBenchGateway(b, up, Options{PrefixAffinity: affinity}), client: newBenchClient(b)}
}

// newBenchUpstream is a trivial upstream answering a fixed small chat completion.
func newBenchUpstream(b *testing.B) string { return newBenchUpstreamUsage(b, false) }

// newBenchUpstreamUsage answers as newBenchUpstream; with usage, chunked with the usage
// trailer, as a node agent answers.
func newBenchUpstreamUsage(b *testing.B, usage bool) string {
	const answer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if usage {
			w.Header().Set("Trailer", metering.Header)
		}
		_, _ = io.WriteString(w, answer)
		if usage {
			w.Header().Set(metering.Header, metering.Usage{Input: 12, Cached: 3, Output: 1}.String())
		}
	}))
	b.Cleanup(up.Close)
	return up.URL
}

// newBenchGateway is a gateway with opts over real loopback HTTP in front of up.
func newBenchGateway(b *testing.B, up string, opts Options) string {
	opts.FleetToken, opts.Registerer, opts.Log = func() string { return "t" }, prometheus.NewRegistry(), logr.Discard()
	g, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")},
		// Slots for every client of the throughput phase: admission is on the path, the
		// queue never holds a request (the upstream is not a runner with few slots).
		[]mfv1.ModelReplica{withParallel(replica("a", "r0", "m", "mac", strings.TrimPrefix(up, "http://"), metav1.ConditionTrue), 8)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	gs := httptest.NewServer(g.Handler())
	b.Cleanup(gs.Close)
	return gs.URL
}

// newBenchClient keeps its connections.
func newBenchClient(b *testing.B) *http.Client {
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

const benchBody = `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hi"}],"max_tokens":8}`

func (s benchSetup) do(b *testing.B, base string) time.Duration {
	start := time.Now()
	resp, err := s.client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(benchBody))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d from %s", resp.StatusCode, base)
	}
	return time.Since(start)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkOverhead measures what the gateway adds to a request against calling the
// same trivial upstream directly, in the same run (see compareEndpoints).
func BenchmarkOverhead(b *testing.B) {
	for _, affinity := range []bool{false, true} {
		b.Run(fmt.Sprintf("affinity=%v", affinity), func(b *testing.B) {
			s := newBenchSetup(b, affinity)
			compareEndpoints(b, s.client, "direct", s.direct, "gateway", s.gateway)
		})
	}
}

// compareEndpoints measures other against base: sequential latency (one request to
// each per iteration, interleaved so both see the same machine state) and throughput
// with 8 concurrent clients. It reports both p50s, the added p50/p99 in µs, both
// requests/s and their ratio.
func compareEndpoints(b *testing.B, client *http.Client, baseName, base, otherName, other string) {
	s := benchSetup{client: client}
	// Warm the connection pools.
	for range 50 {
		s.do(b, base)
		s.do(b, other)
	}
	var lb, lo []time.Duration
	b.ResetTimer()
	for b.Loop() {
		lb = append(lb, s.do(b, base))
		lo = append(lo, s.do(b, other))
	}
	b.StopTimer()
	b50, b99 := percentile(lb, 0.5), percentile(lb, 0.99)
	o50, o99 := percentile(lo, 0.5), percentile(lo, 0.99)
	b.ReportMetric(float64(b50.Microseconds()), baseName+"-p50-µs")
	b.ReportMetric(float64(o50.Microseconds()), otherName+"-p50-µs")
	b.ReportMetric(float64((o50 - b50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((o99 - b99).Microseconds()), "added-p99-µs")

	const clients, perClient = 8, 500
	rps := func(url string) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for range perClient {
					s.do(b, url)
				}
			})
		}
		wg.Wait()
		return clients * perClient / time.Since(start).Seconds()
	}
	rb, ro := rps(base), rps(other)
	b.ReportMetric(rb, baseName+"-req/s")
	b.ReportMetric(ro, otherName+"-req/s")
	b.ReportMetric(ro/rb, "rps-ratio")
	b.Logf("sequential: %s p50 %v p99 %v; %s p50 %v p99 %v; added p50 %v p99 %v (latency ratio p50 %.2f)",
		baseName, b50, b99, otherName, o50, o99, o50-b50, o99-b99, float64(o50)/float64(b50))
	b.Logf("8 clients: %s %.0f req/s, %s %.0f req/s (ratio %.2f)", baseName, rb, otherName, ro, ro/rb)
}

// BenchmarkTracingOverhead measures what tracing adds to the gateway: two gateways in
// front of the same trivial upstream, one without tracing and one exporting every span
// over OTLP/HTTP to a receiver on loopback (the SDK's batch processor, as in
// production), compared as in compareEndpoints.
func BenchmarkTracingOverhead(b *testing.B) {
	rcv, err := otlptest.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rcv.Close)
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	tp, err := tracing.New(b.Context(), tracing.Options{Service: tracing.ServiceGateway})
	if err != nil || tp == nil {
		b.Fatalf("tracing.New = %v, %v", tp, err)
	}
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	up := newBenchUpstream(b)
	off := newBenchGateway(b, up, Options{})
	on := newBenchGateway(b, up, Options{TracerProvider: tp.TracerProvider()})
	compareEndpoints(b, newBenchClient(b), "off", off, "on", on)
	if err := tp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	n := len(rcv.Spans(""))
	if n == 0 {
		b.Fatal("the traced gateway exported no spans")
	}
	b.Logf("%d spans exported", n)
}

// benchKey is the team key of the benchmarks: Secret a/k, of the benchmark
// deployment's namespace.
const benchKey = "bench-team-key-0123456789"

// BenchmarkTenantOverhead measures what teams' keys add to the gateway: two gateways
// in front of the same trivial upstream, one without keys and one that identifies each
// request's key (a team key of the deployment's namespace, looked up by hash) and
// resolves the model as that team sees it, compared as in compareEndpoints. Every
// request carries the key; the gateway without keys ignores it.
func BenchmarkTenantOverhead(b *testing.B) {
	keys := benchTeamKeys(b)
	up := newBenchUpstream(b)
	open := newBenchGateway(b, up, Options{})
	scoped := newBenchGateway(b, up, Options{Identify: keys.Lookup})
	client := newBenchClient(b)
	client.Transport = withHeader{next: client.Transport, key: "Authorization", value: "Bearer " + benchKey}
	compareEndpoints(b, client, "no-keys", open, "team-key", scoped)
}

// benchTeamKeys holds benchKey.
func benchTeamKeys(b *testing.B) *tenancy.Keys {
	keys, problems := tenancy.Build([]corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "k"},
		Type: tenancy.SecretType, Data: map[string][]byte{tenancy.KeyField: []byte(benchKey)}}})
	if len(problems) != 0 {
		b.Fatal(problems)
	}
	return keys
}

// withHeader sets one header on every request.
type withHeader struct {
	next       http.RoundTripper
	key, value string
}

func (h withHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.key, h.value)
	return h.next.RoundTrip(r)
}

// BenchmarkUsageOverhead measures what metering adds: the same gateway kind (a team
// key, as in BenchmarkTenantOverhead) in front of an upstream that answers without
// usage and one that answers, as an agent does, chunked with the usage trailer, which
// the gateway parses and counts.
func BenchmarkUsageOverhead(b *testing.B) {
	keys := benchTeamKeys(b)
	plain := newBenchGateway(b, newBenchUpstreamUsage(b, false), Options{Identify: keys.Lookup})
	metered := newBenchGateway(b, newBenchUpstreamUsage(b, true), Options{Identify: keys.Lookup})
	client := newBenchClient(b)
	client.Transport = withHeader{next: client.Transport, key: "Authorization", value: "Bearer " + benchKey}
	compareEndpoints(b, client, "no-usage", plain, "usage-trailer", metered)
}

// BenchmarkServiceAccountOverhead measures what a ServiceAccount token costs on the
// gateway's path against a team key, once its review is cached (every request but the
// first): two gateways in front of the same trivial upstream, one identifying each
// request's team key, one each request's token (satoken.Reviewer, whose API server
// answers the first review of it). The token is shaped and sized like one the API
// server mints (about 1 KB).
func BenchmarkServiceAccountOverhead(b *testing.B) {
	keys := benchTeamKeys(b)
	enc := base64.RawURLEncoding.EncodeToString
	token := enc([]byte(`{"alg":"RS256","kid":"bench"}`)) + "." +
		enc([]byte(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d,"iss":"https://kubernetes.default.svc","kubernetes.io":{"namespace":"a","serviceaccount":{"name":"ci","uid":"0b7c1e9e-4f7e-4d0e-9f8a-2f3c1d2e3f4a"}},"sub":"system:serviceaccount:a:ci"}`,
			time.Now().Add(time.Hour).Unix()))) + "." + enc(make([]byte, 256))
	rev, err := satoken.New(benchReviews{}, satoken.Options{})
	if err != nil {
		b.Fatal(err)
	}
	up := newBenchUpstream(b)
	keyed := newBenchGateway(b, up, Options{Identify: keys.Lookup})
	tokened := newBenchGateway(b, up, Options{Identify: keys.Lookup, ReviewToken: rev.Review})
	client := newBenchClient(b)
	client.Transport = authByHost{next: client.Transport, auth: map[string]string{
		strings.TrimPrefix(keyed, "http://"): "Bearer " + benchKey, strings.TrimPrefix(tokened, "http://"): "Bearer " + token}}
	compareEndpoints(b, client, "team-key", keyed, "sa-token", tokened)
}

// benchReviews authenticates every token as ServiceAccount a/ci.
type benchReviews struct{}

func (benchReviews) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	out := tr.DeepCopy()
	out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
		User: authnv1.UserInfo{Username: "system:serviceaccount:a:ci"}}
	return out, nil
}

// authByHost sets the Authorization header by the request's host.
type authByHost struct {
	next http.RoundTripper
	auth map[string]string
}

func (h authByHost) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", h.auth[r.URL.Host])
	return h.next.RoundTrip(r)
}

// BenchmarkBudgetOverhead measures what TokenBudgets and the usage ledger add to the
// request path: each request is checked against two budgets that apply with room (the
// namespace's, with every window and a concurrency limit, and the key's) plus another
// replica's published record, counted in flight, and its usage added to the ledger.
// The ledger's writes to the API server run beside the path, every 200 ms, and are not
// in it. Two comparisons: "budgets", a metered team-key gateway without budgets
// against the same with them; "all", a gateway without keys or usage (today's hot path
// before issue 23) against the budgeted one: keys, scoping, metering and budgets
// together.
func BenchmarkBudgetOverhead(b *testing.B) {
	keys := benchTeamKeys(b)
	l := ledger.New("bench-0", clock.RealClock{})
	bs := admission.NewBudgets(l, nil, clock.RealClock{}, logr.Discard())
	lots := ptr.To[int64](1 << 50)
	bs.SetBudgets([]mfv1.TokenBudget{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "team"}, Spec: mfv1.TokenBudgetSpec{TokensPerMinute: lots,
			TokensPerHour: lots, TokensPerDay: lots, ConcurrentRequests: ptr.To[int32](1 << 20)}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "k"}, Spec: mfv1.TokenBudgetSpec{Key: "k", TokensPerMinute: lots}},
	})
	now := time.Now()
	minute, hour, renewed := metav1.NewTime(now.UTC().Truncate(time.Minute)), metav1.NewTime(now.UTC().Truncate(time.Hour)), metav1.NewMicroTime(now)
	bs.ObserveRecord(&mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: ledger.RecordName("bench-1", now)},
		Spec: mfv1.TokenUsageSpec{Gateway: "bench-1", Day: now.UTC().Format(time.DateOnly), RenewTime: &renewed,
			Usage:   []mfv1.KeyUsage{{Key: "k", Deployment: "a/bench", Requests: 10, InputTokens: 100, OutputTokens: 50}},
			Windows: []mfv1.KeyWindow{{Key: "k", Minute: &minute, MinuteTokens: 150, Hour: &hour, HourTokens: 150, InFlight: 1}}}}, false)

	metered := newBenchGateway(b, newBenchUpstreamUsage(b, true), Options{Identify: keys.Lookup})
	budgeted := newBenchGateway(b, newBenchUpstreamUsage(b, true), Options{Identify: keys.Lookup, Budgets: bs})
	open := newBenchGateway(b, newBenchUpstreamUsage(b, false), Options{})
	client := newBenchClient(b)
	client.Transport = withHeader{next: client.Transport, key: "Authorization", value: "Bearer " + benchKey}
	b.Run("budgets", func(b *testing.B) { compareEndpoints(b, client, "metered", metered, "budgeted", budgeted) })
	b.Run("all", func(b *testing.B) { compareEndpoints(b, client, "no-keys", open, "keys-metering-budgets", budgeted) })
	if d, _ := l.Admit("a", "k", 1, func(o budget.Own) budget.Decision {
		return budget.Decision{Allowed: o.Key.MinuteTokens+o.Key.HourTokens > 0}
	}); !d.Allowed {
		b.Error("the budgeted gateway's ledger counted nothing: the budgets were not on its path")
	}
}
