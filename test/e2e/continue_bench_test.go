package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// seamStreams is how many streams a round of BenchmarkStreamSeam sends, and seamSlots
// each replica's slots: none waits in the queue (each one's TTFT is a cold prefill),
// and the surviving replica has a slot free for every stream of the victim's.
const (
	seamStreams = 4
	seamSlots   = 4
)

// BenchmarkStreamSeam measures the gap a client sees where its stream is continued:
// each round streams seamStreams chats to a new two-replica deployment, kills one
// replica's runner with SIGKILL while they stream, and takes, for each stream that
// was continued, the time between its last content chunk before the kill and its
// first after. It reports the seam's p50/p99 against the p50/p99 TTFT of the same
// streams (a cold prefill of prompts of the same shape: what a client that starts
// over would wait before its first token again, before regenerating what it had).
//
//	go test ./test/e2e -run '^$' -bench StreamSeam -benchtime 8x
func BenchmarkStreamSeam(b *testing.B) {
	var seams, ttfts []time.Duration
	for round := range b.N {
		s, f := seamRound(b, round)
		seams, ttfts = append(seams, s...), append(ttfts, f...)
	}
	if len(seams) == 0 {
		b.Fatal("no stream was continued in any round")
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(float64(len(seams)), "seams")
	b.ReportMetric(ms(pctl(seams, 0.5)), "seam-p50-ms")
	b.ReportMetric(ms(pctl(seams, 0.99)), "seam-p99-ms")
	b.ReportMetric(ms(pctl(ttfts, 0.5)), "cold-ttft-p50-ms")
	b.ReportMetric(ms(pctl(ttfts, 0.99)), "cold-ttft-p99-ms")
}

// seamRound runs one round: the seams of its continued streams, every stream's TTFT.
func seamRound(b *testing.B, round int) (seams, ttfts []time.Duration) {
	ns := testenv.NewNamespace(b, fleet.Client)
	md := deployment(ns, "seam", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
		md.Spec.Engine.Settings = engine.Settings{ContextLength: 1024, Parallel: seamSlots}
	})
	if err := fleet.Client.Create(b.Context(), md); err != nil {
		b.Fatal(err)
	}
	defer func() { // the next round's replicas find both Macs free
		removeDeployment(b, ns, "seam")
		testenv.Eventually(b, time.Minute, 100*time.Millisecond, func() (bool, string) {
			var l v1alpha1.ModelReplicaList
			err := fleet.Client.List(context.Background(), &l, client.InNamespace(ns))
			return err == nil && len(l.Items) == 0, fmt.Sprintf("%d replicas left (%v)", len(l.Items), err)
		})
	}()
	victim := waitReady(b, ns, "seam", 2, 3*time.Minute)[0]
	key, addr := victim.Namespace+"/"+victim.Name, fleet.Agent(victim.Spec.NodeName).Addr
	pids, err := runnerPIDsErr(b.Context(), addr)
	if err != nil || pids[key] == 0 {
		b.Fatalf("no runner for %s: %v %v", key, pids, err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	runs := make([]*seamRun, seamStreams)
	var wg sync.WaitGroup
	for i := range seamStreams {
		runs[i] = &seamRun{}
		wg.Go(func() { runs[i].stream(ctx, ns+"/seam", round*seamStreams+i) })
	}
	testenv.Eventually(b, time.Minute, 5*time.Millisecond, func() (bool, string) {
		started := 0
		for i := range runs {
			if runs[i].started() {
				started++
			}
		}
		return started == seamStreams, fmt.Sprintf("%d of %d streams have content", started, seamStreams)
	})
	if err := syscall.Kill(int(pids[key]), syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	killed := time.Now()
	wg.Wait()
	for i, r := range runs {
		if r.err != "" {
			b.Fatalf("stream %d: %s", i, r.err)
		}
		ttfts = append(ttfts, r.chunks[0].Sub(r.sent))
		if r.continued == "" {
			continue
		}
		for j := 1; j < len(r.chunks); j++ {
			if r.chunks[j].After(killed) {
				seams = append(seams, r.chunks[j].Sub(r.chunks[j-1]))
				break
			}
		}
	}
	return seams, ttfts
}

// seamRun is what one stream of a round saw: when it was sent, when each content
// chunk came, its X-Macfleet-Continued trailer and what was wrong ("" for nothing).
type seamRun struct {
	mu        sync.Mutex
	sent      time.Time
	chunks    []time.Time
	continued string
	err       string
}

func (r *seamRun) started() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.chunks) > 0
}

// stream streams one chat, timing its content chunks.
func (r *seamRun) stream(ctx context.Context, model string, i int) {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":400,"temperature":0,
		"messages":[{"role":"user","content":"Seam %d: tell me a very long story about the sea."}]}`, model, i)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fleet.GatewayURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	r.sent = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.err = err.Error()
		return
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		switch {
		case strings.Contains(line, `"error"`):
			r.err = line
		case strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
			r.mu.Lock()
			r.chunks = append(r.chunks, time.Now())
			r.mu.Unlock()
		}
	}
	r.continued = resp.Trailer.Get("X-Macfleet-Continued")
	if len(r.chunks) == 0 && r.err == "" {
		r.err = "no content"
	}
}
