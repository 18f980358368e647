package promptcache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Issue 26: a replica that misses a prefix imports another Mac's state of it instead
// of prefilling it. These are the runner's costs of that, on one runner.
const (
	peerPromptTokens = 8192
	peerTarget       = 10.0 // import + restore at least 10× faster than the prefill
	// Links the transfer is projected onto, bytes per second.
	link10GbE = 1.1e9
	linkTB5   = 5e9
)

// BenchmarkPeerImport8k: on the mid model, the time to prefill an 8,192-token prompt
// (cold, one token generated) against the time to import its state (POST
// /cache/states of the entry GET /cache/states/{digest} exported after that prefill)
// and answer the same prompt from it, on the same runner, the slot and the hot tier
// emptied in between; and the entry's bytes per token, projected onto 10 GbE and
// Thunderbolt 5 links. The runner keeps no SSD tier: an import hands the SSD its copy
// on another goroutine, off the request's path, as a save does. Each round is a fresh
// prompt; a smaller warm-up round goes first. MACFLEET_BENCH_PEER_TOKENS sets another
// prompt size, MACFLEET_BENCH_ROUNDS the rounds, MACFLEET_BENCH_THREADS the threads.
//
//	MACFLEET_RUNNER=$PWD/bin/macfleet-runner hack/go-env.sh go test -run '^$' -bench PeerImport8k -benchtime 1x -timeout 30m ./test/bench/promptcache/
func BenchmarkPeerImport8k(b *testing.B) {
	bin := runnerBinary(b)
	threads := os.Getenv("MACFLEET_BENCH_THREADS")
	if threads == "" {
		threads = "2"
	}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("MACFLEET_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	promptTokens := peerPromptTokens
	if v, err := strconv.Atoi(os.Getenv("MACFLEET_BENCH_PEER_TOKENS")); err == nil && v > 0 {
		promptTokens = v // a smaller smoke run of the harness
	}
	r := startRunner(b, bin, midModel(b), threads, "--ctx", strconv.Itoa(promptTokens+1024),
		"--prompt-cache-hot-bytes", strconv.Itoa(4<<30))
	perWord := float64(r.tokens(peerMsgs(1, 1000))) / 1000

	var samples []peerSample
	run := func(round, tokens int, record bool) {
		msgs := peerMsgs(uint64(100+round), int(float64(tokens)/perWord))
		s := peerRound(b, r, msgs, fmt.Sprintf("%016x", 0xd000+round))
		if record {
			samples = append(samples, s)
			b.Logf("round %d: prompt %d tokens, prefill %.0f ms; entry %.1f MiB, import %.0f ms, answer from it %.0f ms (%d restored)",
				round, s.prompt, ms(s.prefill), float64(s.bytes)/(1<<20), ms(s.imp), ms(s.restore), s.restored)
		}
	}
	run(0, promptTokens/8, false)
	b.ResetTimer()
	for i := range rounds * b.N {
		run(i+1, promptTokens, true)
	}
	b.StopTimer()
	reportPeer(b, samples)
}

type peerSample struct {
	prompt, restored, tokens int
	bytes                    int64
	prefill, imp, restore    time.Duration
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// peerMsgs is a one-message chat of n words.
func peerMsgs(seed uint64, n int) msgs {
	return msgs{{"role": "user", "content": words(seed, n)}}
}

// peerRound prefills msgs cold (tagged with digest), exports the state, empties the
// runner, imports the state and answers msgs again from it.
func peerRound(b *testing.B, r *runner, m msgs, digest string) peerSample {
	r.post("/cache/clear", nil, nil)
	prefill, cached := r.ttftWith(m, http.Header{runnerapi.HeaderPrefixDigests: {digest}})
	if cached != 0 {
		b.Fatalf("the cold prefill restored %d tokens", cached)
	}
	entry, tokens := r.exportState(digest)
	r.post("/cache/clear", nil, nil) // the slot's prefix and the hot tier: nothing left of it
	start := time.Now()
	res := r.importState(entry)
	imp := time.Since(start)
	if !res.Imported || res.Bytes != int64(len(entry)) {
		b.Fatalf("import: %+v", res)
	}
	restore, restored := r.ttft(m)
	prompt := r.tokens(m)
	if restored < prompt-64 {
		b.Fatalf("the answer after the import restored %d of %d tokens", restored, prompt)
	}
	return peerSample{prompt: prompt, restored: restored, tokens: tokens, bytes: int64(len(entry)),
		prefill: prefill, imp: imp, restore: restore}
}

// exportState is GET /cache/states/{digest} once the state is saved: the entry and
// the tokens the state holds.
func (r *runner) exportState(digest string) ([]byte, int) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.client.Get(r.base + "/cache/states/" + digest)
		if err != nil {
			r.b.Fatal(err)
		}
		entry, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			tokens, _ := strconv.Atoi(resp.Header.Get(runnerapi.HeaderStateTokens))
			return entry, tokens
		}
		if time.Now().After(deadline) {
			r.b.Fatalf("export of %s: %d %s", digest, resp.StatusCode, entry)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *runner) importState(entry []byte) runnerapi.PeerStateResult {
	resp, err := r.client.Post(r.base+"/cache/states", "application/octet-stream", bytes.NewReader(entry))
	if err != nil {
		r.b.Fatal(err)
	}
	defer resp.Body.Close()
	var res runnerapi.PeerStateResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusOK {
		r.b.Fatalf("import: %d %+v %v", resp.StatusCode, res, err)
	}
	return res
}

// reportPeer reports the medians, the speed-up and the projections onto the links.
func reportPeer(b *testing.B, s []peerSample) {
	med := func(f func(peerSample) float64) float64 {
		v := make([]float64, len(s))
		for i, x := range s {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	prefill := med(func(x peerSample) float64 { return ms(x.prefill) })
	imp := med(func(x peerSample) float64 { return ms(x.imp) })
	restore := med(func(x peerSample) float64 { return ms(x.restore) })
	perToken := med(func(x peerSample) float64 { return float64(x.bytes) / float64(x.tokens) })
	bytes := med(func(x peerSample) float64 { return float64(x.bytes) })
	x := prefill / (imp + restore)
	b.ReportMetric(prefill, "ms-prefill")
	b.ReportMetric(imp, "ms-import")
	b.ReportMetric(restore, "ms-restore")
	b.ReportMetric(x, "x-import")
	b.ReportMetric(perToken, "B/token")
	b.Logf("median of %d rounds: prefill %.0f ms; import %.0f ms + answer from the import %.0f ms = %.1fx faster (target %.0fx %s); "+
		"entry %.1f MiB, %.0f bytes per token", len(s), prefill, imp, restore, x, peerTarget, verdict(x >= peerTarget), bytes/(1<<20), perToken)
	for _, l := range []struct {
		name string
		rate float64
	}{{"10 GbE (1.1 GB/s)", link10GbE}, {"Thunderbolt 5 (5 GB/s)", linkTB5}} {
		transfer := bytes / l.rate * 1000
		total := transfer + imp + restore
		b.Logf("over %s: transfer %.0f ms + import + answer = %.0f ms, %.1fx faster than the prefill (target %.0fx %s)",
			l.name, transfer, total, prefill/total, peerTarget, verdict(prefill/total >= peerTarget))
	}
}
