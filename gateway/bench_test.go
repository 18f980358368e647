package gateway

import (
	"context"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/otlptest"
	"github.com/macfleet/macfleet/tracing"
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
func newBenchUpstream(b *testing.B) string {
	const answer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
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
// same trivial upstream directly, in the same run: sequential latency (one direct
// and one gateway request per iteration, interleaved so both see the same machine
// state) and throughput with 8 concurrent clients. It reports p50/p99 of both, the
// added p50/p99 in µs, requests/s of both and their ratio.
func BenchmarkOverhead(b *testing.B) {
	for _, affinity := range []bool{false, true} {
		b.Run(fmt.Sprintf("affinity=%v", affinity), func(b *testing.B) {
			s := newBenchSetup(b, affinity)
			// Warm the connection pools.
			for range 50 {
				s.do(b, s.direct)
				s.do(b, s.gateway)
			}
			var direct, viaGW []time.Duration
			b.ResetTimer()
			for b.Loop() {
				direct = append(direct, s.do(b, s.direct))
				viaGW = append(viaGW, s.do(b, s.gateway))
			}
			b.StopTimer()
			d50, d99 := percentile(direct, 0.5), percentile(direct, 0.99)
			g50, g99 := percentile(viaGW, 0.5), percentile(viaGW, 0.99)
			b.ReportMetric(float64(d50.Microseconds()), "direct-p50-µs")
			b.ReportMetric(float64(g50.Microseconds()), "gateway-p50-µs")
			b.ReportMetric(float64((g50 - d50).Microseconds()), "added-p50-µs")
			b.ReportMetric(float64((g99 - d99).Microseconds()), "added-p99-µs")

			const clients, perClient = 8, 500
			rps := func(base string) float64 {
				var wg sync.WaitGroup
				start := time.Now()
				for range clients {
					wg.Go(func() {
						for range perClient {
							s.do(b, base)
						}
					})
				}
				wg.Wait()
				return clients * perClient / time.Since(start).Seconds()
			}
			rd, rg := rps(s.direct), rps(s.gateway)
			b.ReportMetric(rd, "direct-req/s")
			b.ReportMetric(rg, "gateway-req/s")
			b.ReportMetric(rg/rd, "rps-ratio")
			b.Logf("sequential: direct p50 %v p99 %v; gateway p50 %v p99 %v; added p50 %v p99 %v (latency ratio p50 %.2f)",
				d50, d99, g50, g99, g50-d50, g99-d99, float64(g50)/float64(d50))
			b.Logf("8 clients: direct %.0f req/s, gateway %.0f req/s (ratio %.2f)", rd, rg, rg/rd)
		})
	}
}

// BenchmarkTracingOverhead measures what tracing adds to the gateway: two gateways in
// front of the same trivial upstream, one without tracing and one exporting every span
// over OTLP/HTTP to a receiver on loopback (the SDK's batch processor, as in
// production), requests interleaved. It reports both p50s, the added p50/p99 in µs and
// the throughput ratio with 8 concurrent clients.
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
	off := benchSetup{direct: newBenchGateway(b, up, Options{}), client: newBenchClient(b)}
	on := newBenchGateway(b, up, Options{TracerProvider: tp.TracerProvider()})
	for range 50 {
		off.do(b, off.direct)
		off.do(b, on)
	}
	var lOff, lOn []time.Duration
	b.ResetTimer()
	for b.Loop() {
		lOff = append(lOff, off.do(b, off.direct))
		lOn = append(lOn, off.do(b, on))
	}
	b.StopTimer()
	o50, o99 := percentile(lOff, 0.5), percentile(lOff, 0.99)
	t50, t99 := percentile(lOn, 0.5), percentile(lOn, 0.99)
	b.ReportMetric(float64(o50.Microseconds()), "off-p50-µs")
	b.ReportMetric(float64(t50.Microseconds()), "on-p50-µs")
	b.ReportMetric(float64((t50 - o50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((t99 - o99).Microseconds()), "added-p99-µs")
	const clients, perClient = 8, 500
	rps := func(base string) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for range perClient {
					off.do(b, base)
				}
			})
		}
		wg.Wait()
		return clients * perClient / time.Since(start).Seconds()
	}
	ro, rt := rps(off.direct), rps(on)
	b.ReportMetric(rt/ro, "rps-ratio")
	if err := tp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	if n := len(rcv.Spans("")); n == 0 {
		b.Fatal("the traced gateway exported no spans")
	}
	b.Logf("sequential: off p50 %v p99 %v; on p50 %v p99 %v; added p50 %v p99 %v", o50, o99, t50, t99, t50-o50, t99-o99)
	b.Logf("8 clients: off %.0f req/s, on %.0f req/s (ratio %.2f); %d spans exported", ro, rt, rt/ro, len(rcv.Spans("")))
}
