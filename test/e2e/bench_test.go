package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// BenchmarkGatewayOverhead measures what the gateway adds in front of an agent: the
// same one-token completion of a trivial model, interleaved, straight to the agent
// that serves it (with the fleet token, as a client of the deployment's Service does)
// and through the gateway. It reports p50/p99 of both, the added p50/p99, and
// requests/s of both with 4 concurrent clients and their ratio.
//
//	go test ./test/e2e -run '^$' -bench GatewayOverhead -benchtime 400x
func BenchmarkGatewayOverhead(b *testing.B) {
	addr, hc := benchDeployment(b, 4, 16)
	body := []byte(`{"model":"bench","max_tokens":1,"temperature":0,"messages":[{"role":"user","content":"hi"}]}`)
	send := func(url, token string) time.Duration {
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
		return time.Since(start)
	}
	direct := localfleet.AgentURL(addr) + "/v1/chat/completions"
	viaGW := fleet.GatewayURL + "/v1/chat/completions"
	for range 20 {
		send(direct, "")
		send(viaGW, "")
	}
	var d, g []time.Duration
	b.ResetTimer()
	for b.Loop() {
		d = append(d, send(direct, ""))
		g = append(g, send(viaGW, ""))
	}
	b.StopTimer()
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	b.ReportMetric(ms(pctl(d, 0.5)), "direct-p50-ms")
	b.ReportMetric(ms(pctl(g, 0.5)), "gateway-p50-ms")
	b.ReportMetric(ms(pctl(g, 0.5)-pctl(d, 0.5)), "added-p50-ms")
	b.ReportMetric(ms(pctl(g, 0.99)-pctl(d, 0.99)), "added-p99-ms")

	const clients, each = 4, 100
	rps := func(url, token string) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for range each {
					send(url, token)
				}
			})
		}
		wg.Wait()
		return clients * each / time.Since(start).Seconds()
	}
	dr, gr := rps(direct, ""), rps(viaGW, "")
	b.ReportMetric(dr, "direct-req/s")
	b.ReportMetric(gr, "gateway-req/s")
	b.ReportMetric(gr/dr, "gateway/direct")
	fmt.Printf("gateway overhead, one-token completions of the tiny model, %d interleaved pairs: p50 %.2f ms direct, %.2f ms gateway "+
		"(+%.2f ms); p99 +%.2f ms; %d clients: %.0f req/s direct, %.0f via the gateway (%.2f)\n",
		len(d), ms(pctl(d, 0.5)), ms(pctl(g, 0.5)), ms(pctl(g, 0.5)-pctl(d, 0.5)), ms(pctl(g, 0.99)-pctl(d, 0.99)), clients, dr, gr, gr/dr)
}

// benchDeployment creates the one-replica deployment "bench" of a trivial model with
// parallel slots, removed when the benchmark ends, waits until it is Ready and returns its agent's address and one
// client for both ways in: the gateway's http:// and the agent's https:// with a
// gateway's certificate, keeping idle connections to each host.
func benchDeployment(b *testing.B, parallel int32, idle int) (string, *http.Client) {
	ns := testenv.NewNamespace(b, fleet.Client)
	md := deployment(ns, "bench", 1, func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.Parallel = parallel })
	if err := fleet.Client.Create(b.Context(), md); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { removeDeployment(b, ns, "bench") }) // the next benchmark's "bench" is its own
	waitReady(b, ns, "bench", 1, 3*time.Minute)
	tr := fleet.AgentHTTP.Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idle
	return sliceAddresses(b, ns, "bench", 1)[0], &http.Client{Transport: tr}
}

// BenchmarkColdStartFromZero measures a request for an autoscaled deployment at zero
// replicas through the gateway — the wake, the autoscaler's scale, placement, the
// fetch from the Mac's store and the load, then the answer — against a warm request to
// the replica it woke, the next moment. Each iteration waits for the deployment to be
// back at zero (WakeHold + scaleDownDelay, about 45 s).
//
//	go test ./test/e2e -run '^$' -bench ColdStartFromZero -benchtime 3x
func BenchmarkColdStartFromZero(b *testing.B) {
	ns := testenv.NewNamespace(b, fleet.Client)
	atZero(b, ns, "lazy")
	c := gatewayClient()
	var cold, warm []time.Duration
	timed := func() time.Duration {
		start := time.Now()
		if _, err := chat(b.Context(), c, ns+"/lazy", true); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for b.Loop() {
		b.StopTimer()
		waitZero(b, ns, "lazy", v1alpha1.WakeHold+zeroDelay+time.Minute)
		b.StartTimer()
		cold = append(cold, timed())
		warm = append(warm, timed())
	}
	med := func(xs []time.Duration) time.Duration {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	b.ReportMetric(ms(med(cold)), "cold-p50-ms")
	b.ReportMetric(ms(med(warm)), "warm-p50-ms")
	b.ReportMetric(float64(med(cold))/float64(med(warm)), "cold/warm")
	fmt.Printf("cold start from zero through the gateway, streamed 8-token chat of the tiny model, %d rounds: cold %v, warm %v (median %.0f ms vs %.1f ms, %.0fx)\n",
		len(cold), cold, warm, ms(med(cold)), ms(med(warm)), float64(med(cold))/float64(med(warm)))
}
