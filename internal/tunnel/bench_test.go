package tunnel

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
)

// benchPair is one handler served twice in the same process: by a Mac reached
// directly at its address (mac-d) and by one reached through its tunnel (mac-t),
// both behind the same TLS, the same client transport.
type benchPair struct {
	c      *http.Client
	direct string // mac-d's address
}

// payload answers ?n=BYTES bytes, 32 KiB a write.
func payload(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	buf := make([]byte, 32<<10)
	for n > 0 {
		k := min(n, len(buf))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

func newBenchPair(b *testing.B) *benchPair {
	fc := newFleetCerts(b)
	s, addr := startGateway(b, fc.gateway)
	startAgent(b, addr, "mac-t", source(b, fc.ca, pki.Node("mac-t")), http.HandlerFunc(payload))
	waitNodes(b, s, "mac-t")
	direct := serveDirect(b, source(b, fc.ca, pki.Node("mac-d")), http.HandlerFunc(payload))
	return &benchPair{c: client(s, fc.gateway), direct: direct}
}

// fetch reads n bytes from node, the way the gateway reaches it.
func (p *benchPair) fetch(b *testing.B, node string, n int) {
	host := unreachable
	if node == "mac-d" {
		host = p.direct
	}
	req, _ := http.NewRequestWithContext(pki.WithNode(context.Background(), node), http.MethodGet,
		"https://"+host+"/?n="+strconv.Itoa(n), nil)
	resp, err := p.c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || got != int64(n) {
		b.Fatalf("%s: read %d of %d bytes: %v", node, got, n, err)
	}
}

// BenchmarkTunnelShortRequest: the p50 latency of a short request (64 bytes back)
// over a kept-alive connection, direct and through the tunnel, and their ratio.
func BenchmarkTunnelShortRequest(b *testing.B) {
	p := newBenchPair(b)
	p.fetch(b, "mac-d", 64) // the connections' handshakes are not measured
	p.fetch(b, "mac-t", 64)
	var direct, tunneled []time.Duration
	b.ResetTimer()
	for range b.N {
		for _, node := range []string{"mac-d", "mac-t"} {
			start := time.Now()
			p.fetch(b, node, 64)
			if node == "mac-d" {
				direct = append(direct, time.Since(start))
			} else {
				tunneled = append(tunneled, time.Since(start))
			}
		}
	}
	d, t := p50(direct), p50(tunneled)
	b.ReportMetric(float64(d.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(t.Microseconds()), "tunnel-p50-µs")
	b.ReportMetric(float64(t)/float64(d), "tunnel/direct-p50")
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkTunnelStream: the throughput of one 16 MiB answer, direct and through
// the tunnel, and their ratio.
func BenchmarkTunnelStream(b *testing.B) {
	const n = 16 << 20
	p := newBenchPair(b)
	var direct, tunneled time.Duration
	b.SetBytes(2 * n)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		p.fetch(b, "mac-d", n)
		direct += time.Since(start)
		start = time.Now()
		p.fetch(b, "mac-t", n)
		tunneled += time.Since(start)
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * n / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(direct), "direct-MB/s")
	b.ReportMetric(mbps(tunneled), "tunnel-MB/s")
	b.ReportMetric(mbps(tunneled)/mbps(direct), "tunnel/direct-throughput")
}
