package promptcache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

const (
	// conversationTokens is the length of the second turn's prompt.
	conversationTokens = 2000
	firstReplyTokens   = 64
	secondUserWords    = 24
	hotTarget          = 5.0
	// hotTargetTools is the hot target with the real vocabulary and template, whose
	// replies (valid UTF-8) the next turn reads as generated.
	hotTargetTools = 20.0
	ssdTarget      = 3.0
)

// words returns n pseudo-random words (deterministic per seed).
func words(seed uint64, n int) string {
	vocab := strings.Fields("the a river stone light over under quick slow green blue market seven " +
		"winter summer paper glass north south engine little garden window silver thread morning " +
		"evening copper harbor yellow bridge forest number letter ocean castle mirror pocket")
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]string, n)
	for i := range out {
		out[i] = vocab[rng.IntN(len(vocab))]
	}
	return strings.Join(out, " ")
}

type msgs = []map[string]any

// weatherTool is the tool of the conversations with tool calls.
var weatherTool = map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
	"description": "Current weather for a city", "parameters": map[string]any{"type": "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}}

func hasToolCalls(m msgs) bool {
	for _, x := range m {
		if x["tool_calls"] != nil {
			return true
		}
	}
	return false
}

// conversation is one two-turn chat sized so that the second turn's prompt is about
// conversationTokens tokens.
type conversation struct {
	first  msgs // the first turn's prompt
	second func(reply string) msgs
}

// newConversation sizes the first message so that the first turn's prompt plus extra
// tokens (the reply, re-tokenized, and the second message) make conversationTokens.
// With tools, the first turn has a system prompt, the user's message, a tool call
// and its result; the reply answers it.
func newConversation(r *runner, seed uint64, extra int, tools bool) conversation {
	second := words(seed+1_000_000, secondUserWords)
	first := func(n int) msgs {
		user := map[string]any{"role": "user", "content": words(seed, n)}
		if !tools {
			return msgs{user}
		}
		id := fmt.Sprintf("call_%d", seed)
		return msgs{{"role": "system", "content": "You answer questions about the weather."}, user,
			{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"` + words(seed+3, 1) + `"}`}}}},
			{"role": "tool", "tool_call_id": id, "content": `{"temperature": 21, "sky": "` + words(seed+4, 2) + `"}`}}
	}
	// The fewest words reaching the target (each word is several tokens).
	lo, hi := 1, 64
	for r.tokens(first(hi))+extra < conversationTokens {
		lo, hi = hi, 2*hi
	}
	for lo < hi {
		mid := (lo + hi) / 2
		if r.tokens(first(mid))+extra >= conversationTokens {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	m := first(hi)
	return conversation{first: m, second: func(reply string) msgs {
		return append(slices.Clone(m), map[string]any{"role": "assistant", "content": reply},
			map[string]any{"role": "user", "content": second})
	}}
}

type sample struct {
	ttft   time.Duration
	cached int
	prompt int
}

// BenchmarkSecondTurnTTFT measures the time to first token of the second turn of a
// 2,000-token conversation on the mid model: prefilled in full by a runner without
// the prompt cache ("none"), restored from the hot tier ("hot": another request took
// the only slot meanwhile), and restored from the SSD tier after POST /cache/clear
// emptied the hot tier, with the files in the page cache ("ssd") and, on Linux,
// evicted from it ("ssd-cold"). Each of $MACFLEET_BENCH_ROUNDS rounds (default 3; ×N
// with -benchtime Nx) runs one fresh conversation per case, cases interleaved, after
// a warm-up round. Threads: $MACFLEET_BENCH_THREADS
// (default 1: ggml's spinning barriers collapse when a thread is descheduled on a busy
// small machine).
func BenchmarkSecondTurnTTFT(b *testing.B) { secondTurn(b, midModel(b), false) }

// BenchmarkSecondTurnTTFTTools is BenchmarkSecondTurnTTFT with the real Llama 3
// vocabulary and Llama 3.1 template, and a tool call and its result in the history.
func BenchmarkSecondTurnTTFTTools(b *testing.B) { secondTurn(b, toolsModel(b), true) }

func secondTurn(b *testing.B, model string, tools bool) {
	bin := runnerBinary(b)
	threads := os.Getenv("MACFLEET_BENCH_THREADS")
	if threads == "" {
		threads = "1"
	}
	cacheDir := b.TempDir()
	plain := startRunner(b, bin, model, threads)
	cached := startRunner(b, bin, model, threads, "--prompt-cache-hot-bytes", fmt.Sprint(2<<30),
		"--prompt-cache-dir", cacheDir)

	cases := []string{"none", "hot", "ssd"}
	if canDropPageCache {
		cases = append(cases, "ssd-cold")
	}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("MACFLEET_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	results := map[string][]sample{}
	var reclaimed []int64
	seed := uint64(1)
	// extra is what the second turn adds to the first turn's prompt, measured by the
	// warm-up (the synthesized model's replies re-tokenize into more tokens than it
	// generated).
	extra := firstReplyTokens + 2*secondUserWords
	run := func(name string, record bool) {
		seed += 2
		r := cached
		if name == "none" {
			r = plain
		}
		conv := newConversation(r, seed, extra, tools)
		reply := r.chat(conv.first, firstReplyTokens)
		second := conv.second(reply)
		if !record {
			extra = r.tokens(second) - r.tokens(conv.first)
		}
		switch name {
		case "none":
			r.post("/cache/clear", nil, nil) // the slot's prefix goes: a full prefill
		case "hot":
			r.chat(msgs{{"role": "user", "content": words(seed+5_000_000, 8)}}, 2) // takes the slot
			// A user's next turn comes seconds later: the SSD writes of this one are done.
			waitPersisted(b, r)
		case "ssd", "ssd-cold":
			waitPersisted(b, r)
			var cc runnerapi.CacheClear
			r.post("/cache/clear", nil, &cc)
			if record {
				reclaimed = append(reclaimed, cc.BytesReclaimed)
			}
			if name == "ssd-cold" {
				dropPageCache(b, cacheDir)
			}
		}
		d, c := r.ttft(second)
		if record {
			results[name] = append(results[name], sample{ttft: d, cached: c, prompt: r.tokens(second)})
		}
	}
	for _, name := range cases { // warm-up: first-use costs out of the figures
		run(name, false)
	}
	b.ResetTimer()
	for i := range rounds * b.N {
		for k := range cases {
			run(cases[(i+k)%len(cases)], true)
		}
	}
	b.StopTimer()

	med := map[string]time.Duration{}
	for _, name := range cases {
		s := results[name]
		ds := make([]time.Duration, len(s))
		var cachedSum, promptSum int
		for i, x := range s {
			ds[i] = x.ttft
			cachedSum += x.cached
			promptSum += x.prompt
		}
		slices.Sort(ds)
		med[name] = ds[len(ds)/2]
		b.ReportMetric(float64(med[name].Microseconds())/1000, "ms-"+name)
		// What is left to prefill decides a restored turn's TTFT: the conversations of
		// each case differ, and so do their replies (a reply whose text is not what the
		// model generated, U+FFFD for bytes that are not UTF-8, is prefilled again).
		var rounds []string
		for _, x := range s {
			rounds = append(rounds, fmt.Sprintf("%.0f ms/%d", float64(x.ttft.Microseconds())/1000, x.prompt-x.cached))
		}
		b.Logf("%-8s median TTFT %8.1f ms (min %.1f, max %.1f), prompt %d tokens, %d restored; rounds (TTFT/tokens prefilled): %s", name,
			float64(med[name].Microseconds())/1000, float64(ds[0].Microseconds())/1000,
			float64(ds[len(ds)-1].Microseconds())/1000, promptSum/len(s), cachedSum/len(s), strings.Join(rounds, ", "))
		if name != "none" && cachedSum == 0 {
			b.Errorf("%s: nothing was restored", name)
		}
		if name == "none" && cachedSum != 0 {
			b.Errorf("none: %d tokens were not prefilled", cachedSum)
		}
	}
	hotWant := hotTarget
	if tools {
		hotWant = hotTargetTools
	}
	hot := float64(med["none"]) / float64(med["hot"])
	ssd := float64(med["none"]) / float64(med["ssd"])
	b.ReportMetric(hot, "x-hot")
	b.ReportMetric(ssd, "x-ssd")
	line := fmt.Sprintf("second-turn TTFT speed-up: hot %.1fx (target %.0fx %s), ssd %.1fx (target %.0fx %s)",
		hot, hotWant, verdict(hot >= hotWant), ssd, ssdTarget, verdict(ssd >= ssdTarget))
	if cold, ok := med["ssd-cold"]; ok {
		x := float64(med["none"]) / float64(cold)
		b.ReportMetric(x, "x-ssd-cold")
		line += fmt.Sprintf(", ssd-cold %.1fx (target %.0fx %s)", x, ssdTarget, verdict(x >= ssdTarget))
	}
	slices.Sort(reclaimed)
	if len(reclaimed) > 0 {
		line += fmt.Sprintf("; hot clear reclaimed %.1f MiB (median)", float64(reclaimed[len(reclaimed)/2])/(1<<20))
	}
	pc := cached.status().PromptCache
	b.Logf("%s", line)
	b.Logf("cache counters: hot %+v", pc.Hot)
	b.Logf("cache counters: ssd %+v", *pc.SSD)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// waitPersisted waits until the SSD tier has written every state handed to it.
func waitPersisted(b *testing.B, r *runner) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pc := r.status().PromptCache
		s := pc.SSD
		if pc.SavesPending == 0 && s.Queued == 0 && s.Saves == s.SavesPersisted+s.Duplicates+s.QuotaRejects+s.Cancelled+s.Errors {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("SSD tier did not settle: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
