package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// BenchmarkSpeculation measures single-stream decode with speculation off and on in
// the same run, request by request in turn on one runner, on the trained test model
// (or the random-weight tiny one): a copy-heavy turn (the answer quotes a file read
// back) and a turn with nothing to copy; then, where the trained draft model is present
// (or MACFLEET_DRAFT_MODEL names one), the turn with nothing to copy on a runner with
// the draft model (--draft; MACFLEET_BENCH_DRAFT_DEVICE gives its --draft-device),
// off and on ("draft"). Each request's prompt is cached
// after the first round, so its time is its decode. It reports both rates, their
// ratio, the median of the rounds' ratios and the share of drafted tokens kept (make
// bench-spec; docs/speculative-decoding.md). Where MACFLEET_BENCH_PEER names another
// server, each row also reports that server's rate on the same request (peerRow).
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench Speculation -benchtime 10x ./test/runner
func BenchmarkSpeculation(b *testing.B) {
	path := speculationModelB(b)
	r := startReady(b, path, "--threads", benchThreads("2"))
	readFile := `{"model":"m","max_tokens":200,"temperature":0,"tools":[` + readTool + `],"messages":[` +
		readBack(unseenFile) + `]}`
	nothing := `{"model":"m","max_tokens":200,"temperature":0,"messages":[{"role":"user","content":"Tell me about the sea."}]}`
	b.Run("copy-heavy", func(b *testing.B) { specRow(b, r, readFile) })
	b.Run("nothing-to-copy", func(b *testing.B) { specRow(b, r, nothing) })
	draft, ok, err := testassets.DraftModelPath()
	if err != nil || !ok {
		b.Logf("no draft row: no draft model (%v); set %s", err, testassets.EnvDraftModel)
		return
	}
	args := []string{"--threads", benchThreads("2"), "--draft", draft}
	if d := os.Getenv("MACFLEET_BENCH_DRAFT_DEVICE"); d != "" {
		args = append(args, "--draft-device", d)
	}
	rd := startReady(b, path, args...)
	if st := rd.status().Draft; st != nil {
		b.Logf("the draft model on %s (%s), greedy head %d bytes", st.Device, st.Placement, st.HeadBytes)
	}
	b.Run("draft", func(b *testing.B) { specRow(b, rd, nothing) })
}

// unseenFile is the copy-heavy turn's file: the words the trained model's corpus
// writes its files in, in an order no document of it holds, so that the answer is a
// quote, not a text the model learned by heart.
const unseenFile = "Result when small every command make project may prefer tool write. Task while before file model task; " +
	"Tool explain test session safe safe prefer tool describe prefer when every. List answer build before request find. " +
	"Warning list finally relevant value code prefer describe exact directory never project show new file;"

// specRow is one row of BenchmarkSpeculation: body asked of r with speculation off,
// on (drafting wherever a draft is found) and left to the runner (no header: where
// its step times say drafts pay) in turn, b.N times each.
func specRow(b *testing.B, r *runner, body string) {
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		b.Fatal(err)
	}
	timed(b, r, m, runnerapi.SpeculationOff) // warms the prompt cache
	var tok [3]int
	var took [3]time.Duration
	var kept, drafted int
	ratios := [3][]float64{}
	for range b.N {
		var d [3]time.Duration
		for i, mode := range specModes {
			// A plain answer first, untimed: a step of another batch shape than the
			// one before costs a card a graph recorded again, which the mode before
			// would otherwise charge to this one.
			timed(b, r, m, runnerapi.SpeculationOff)
			n, t, u := timed(b, r, m, mode)
			tok[i], took[i], d[i] = tok[i]+n, took[i]+t, t
			if det := u.CompletionTokensDetails; det != nil && mode == runnerapi.SpeculationOn {
				kept += det.AcceptedPredictionTokens
				drafted += det.AcceptedPredictionTokens + det.RejectedPredictionTokens
			}
		}
		for i := 1; i < 3; i++ {
			ratios[i] = append(ratios[i], d[0].Seconds()/d[i].Seconds()) // the same tokens: a rate ratio
		}
	}
	var rates [3]float64
	for i := range rates {
		rates[i] = float64(tok[i]) / took[i].Seconds()
	}
	reportModes(b, rates, ratios, "tok/s")
	if drafted > 0 {
		b.ReportMetric(float64(kept)/float64(drafted), "kept/drafted")
	}
	b.ReportMetric(float64(tok[1])/float64(b.N), "tokens/answer")
	peerRow(b, m, rates[2])
}

// envBenchPeer is the base URL of another OpenAI-compatible server serving the
// benchmark's model as "m" (docs/gpu-runs/spec-peer.sh starts the peer server so on
// the card, beside the runner).
const envBenchPeer = "MACFLEET_BENCH_PEER"

// peerRow asks the server envBenchPeer names the row's conversation b.N times, after
// one not counted, and reports its rate (peer-tok/s), its answers' length
// (peer-tokens/answer) and auto's rate against it (auto/peer). The request goes
// without its tool list: the peer server renders the trained model's conversation
// with a template of its own, detected from the model file, which takes no tools (it
// refuses a request with them), and still quotes the file read back. A server that
// refuses the request is logged and leaves the row without these figures.
func peerRow(b *testing.B, body map[string]any, auto float64) {
	base := os.Getenv(envBenchPeer)
	if base == "" {
		return
	}
	body = maps.Clone(body)
	delete(body, "tools")
	raw, err := json.Marshal(body)
	if err != nil {
		b.Fatal(err)
	}
	ask := func() (int, time.Duration, error) {
		start := time.Now()
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		msg, err := io.ReadAll(resp.Body)
		var c struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(msg, &c) != nil || c.Usage == nil {
			return 0, 0, fmt.Errorf("%d %s (%v)", resp.StatusCode, msg, err)
		}
		return c.Usage.CompletionTokens, time.Since(start), nil
	}
	if _, _, err := ask(); err != nil {
		b.Logf("the peer at %s: %v; no peer figures", base, err)
		return
	}
	var tok int
	var took time.Duration
	for range b.N {
		n, d, err := ask()
		if err != nil {
			b.Fatalf("the peer at %s: %v", base, err)
		}
		tok, took = tok+n, took+d
	}
	rate := float64(tok) / took.Seconds()
	b.ReportMetric(rate, "peer-tok/s")
	b.ReportMetric(auto/rate, "auto/peer")
	b.ReportMetric(float64(tok)/float64(b.N), "peer-tokens/answer")
}

// speculationModelB is speculationModel for a benchmark.
func speculationModelB(b *testing.B) string {
	b.Helper()
	if path, ok := trainedModel(); ok {
		return path
	}
	return model(b, "tiny")
}

// timed posts one chat request with speculation spec and returns its completion
// tokens, its time and its usage.
func timed(b *testing.B, r *runner, body map[string]any, spec string) (int, time.Duration, runnerapi.Usage) {
	b.Helper()
	start := time.Now()
	resp := postChat(b, r, body, runnerapi.HeaderSpeculation, spec)
	defer resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 || c.Usage == nil {
		b.Fatalf("speculation %s: %d %v", spec, resp.StatusCode, err)
	}
	return c.Usage.CompletionTokens, time.Since(start), *c.Usage
}
