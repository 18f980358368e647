package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestFillersKeepIdleSlotsIntact: with busy slots 0 and 2 and slot 1 idle between
// them, holding a cached prompt, the runner decodes a filler token in slot 1 at each
// step (llama.cpp would otherwise split every step into one micro-batch a run of busy
// slots: engine_fillers.go) and removes it after the step. Slot 0 drafts (speculation
// asked on), and at its drafting steps slots 1 and 2 are padded with fillers to as
// many tokens as slot 0 holds. The busy slots' answers are what each gives alone,
// and slot 1's sequence is what its answer left: the answer continued is served from
// it, prompt and answer, and reads as it does alone.
//
// Every family the model matrix synthesizes takes the same path (mixtures of experts,
// sliding-window attention, attention sinks); the hybrid with a recurrent state gets
// no filler (one would advance its state for good), and its answers are the same.
func TestFillersKeepIdleSlotsIntact(t *testing.T) {
	t.Setenv("MACFLEET_FILLERS", "1") // on a CPU they are off by default
	t.Run("tiny", func(t *testing.T) { fillersKeepIdleSlot(t, model(t, "tiny"), true) })
	for _, f := range ggufsynth.Families {
		t.Run(f.Arch(), func(t *testing.T) {
			spec, err := ggufsynth.TinyFamily(f)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), f.Arch()+".gguf")
			if err := ggufsynth.Write(path, spec); err != nil {
				t.Fatal(err)
			}
			fillersKeepIdleSlot(t, path, f != ggufsynth.Qwen3Next)
		})
	}
}

// fillersKeepIdleSlot is TestFillersKeepIdleSlotsIntact on the model at path, whose
// runner decodes fillers or, where fill is false, must decode none. Each attempt
// asks other prompts: a greedy answer that ends by itself while parked (or follow-ups
// that never overlapped) would end so again with the same prompts.
func fillersKeepIdleSlot(t *testing.T, path string, fill bool) {
	r := startReady(t, path, "--parallel", "3", "--ctx", "6144")
	const attempts = 3
	var cc runnerapi.CacheClear
	for attempt := 1; ; attempt++ {
		ft := newFillerTurns(t, r, attempt)
		if code := r.postJSON("/cache/clear", nil, &cc); code != http.StatusOK {
			t.Fatalf("cache clear: %d", code)
		}
		if ended := parkInOrder(t, r, ft.p[:]); ended != "" {
			t.Logf("attempt %d: %s before the next prompt took a slot; parking other prompts", attempt, ended)
			if attempt == attempts {
				t.Fatalf("in %d attempts the three prompts never held slots 0, 1 and 2 at once", attempt)
			}
			continue
		}
		filled, padded := ft.followUps(t, r)
		if !fill {
			if filled != 0 || padded != 0 {
				t.Fatalf("%d filler tokens decoded (%d steps padded) where the model keeps a recurrent state", filled, padded)
			}
			return
		}
		if filled > 0 && padded > 0 {
			t.Logf("attempt %d: %d filler tokens beside the two follow-ups, %d steps padded", attempt, filled, padded)
			return
		}
		if attempt == attempts {
			t.Fatalf("in %d attempts no step filled an idle slot between busy ones, or padded one with a draft (the follow-ups did not overlap, or slot 0 drafted only alone): %d fillers, %d steps padded", attempt, filled, padded)
		}
		t.Logf("attempt %d: %d fillers, %d steps padded; parking other prompts", attempt, filled, padded)
	}
}

// fillerTurns are one attempt's prompts for slots 0–2, the follow-ups of slots 0
// and 2, and what each gives alone: the follow-ups' tokens, and slot 1's answer
// continued.
type fillerTurns struct {
	p, follow    [3]string
	alone        map[int][]runnerapi.TokenLogprob
	turn         map[string]any // slot 1's answer continued
	ids          []int32        // its answer's token ids
	promptTokens int            // its prompt's length
	turnAlone    runnerapi.ChatCompletion
}

// followTokens is the follow-ups' length: long enough that the two overlap on a
// loaded machine.
const followTokens = 160

// newFillerTurns are attempt's prompts (the attempts' words differ) and their
// answers alone.
func newFillerTurns(t *testing.T, r *runner, attempt int) *fillerTurns {
	t.Helper()
	prompt := func(i int) string {
		var b strings.Builder
		for k := range 40 {
			fmt.Fprintf(&b, "w%d_%d ", i+3*(attempt-1), k*7%13)
		}
		return strings.TrimSpace(b.String())
	}
	ft := &fillerTurns{p: [3]string{prompt(0), prompt(1), prompt(2)}}
	ft.follow = [3]string{ft.p[0] + " and then", "", ft.p[2] + " and then"}
	ft.alone = map[int][]runnerapi.TokenLogprob{0: soloGreedy(t, r, ft.follow[0], followTokens), 2: soloGreedy(t, r, ft.follow[2], followTokens)}
	// Slot 1's answer continued (the final message left open, as the tokens it was
	// generated as) reuses slot 1's whole sequence, prompt and answer: a cell left past
	// it would sit where the continuation's first token goes.
	var answer string
	answer, ft.ids, ft.promptTokens = answerWithIDs(t, r, chatBody(ft.p[1], 64, true))
	ft.turn = map[string]any{"model": "test", "temperature": 0, "max_tokens": 80, "messages": []map[string]string{
		{"role": "user", "content": ft.p[1]}, {"role": "assistant", "content": answer}}}
	ft.turnAlone = ft.continued(t, r)
	return ft
}

// continued asks for slot 1's answer continued.
func (ft *fillerTurns) continued(t *testing.T, r *runner) runnerapi.ChatCompletion {
	t.Helper()
	resp := postChat(t, r, ft.turn, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage,
		runnerapi.HeaderContinuedTokenIDs, runnerapi.FormatTokenIDs(ft.ids))
	defer resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK || len(c.Choices) != 1 {
		t.Fatalf("the idle slot's answer continued: status %d, %v", resp.StatusCode, err)
	}
	return c
}

// followUps runs, with the prompts parked, the follow-ups of p[0] and p[2], which
// reuse slots 0 and 2 (a cached prefix of more than 32 tokens) while slot 1 idles
// between them, slot 0 drafting wherever its prompt lookup finds a draft. It checks
// the follow-ups' tokens and slot 1's answer continued against theirs alone, and
// returns the filler tokens decoded and the steps padded meanwhile.
func (ft *fillerTurns) followUps(t *testing.T, r *runner) (filled, padded int64) {
	t.Helper()
	st := r.status()
	before, paddedBefore := st.FillerTokens, st.PaddedSteps
	got := map[int][]runnerapi.TokenLogprob{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, i := range []int{0, 2} {
		wg.Go(func() {
			var toks []runnerapi.TokenLogprob
			if i == 0 {
				toks = greedyWith(t, r, greedyLogprobs(ft.follow[i], followTokens, false), runnerapi.HeaderSpeculation, runnerapi.SpeculationOn)
			} else {
				chunks, _, _, _ := streamChat(t, r, context.Background(), greedyLogprobs(ft.follow[i], followTokens, true), func(chunk) bool { return true })
				for _, c := range chunks {
					for _, ch := range c.Choices {
						if ch.Logprobs != nil {
							toks = append(toks, ch.Logprobs.Content...)
						}
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			got[i] = toks
		})
	}
	wg.Wait()
	st = r.status()
	for _, i := range []int{0, 2} {
		if d := departure(ft.alone[i], got[i]); d != "" {
			t.Errorf("slot %d's follow-up beside a filled slot: it %s", i, d)
		}
	}
	// Slot 1's answer continued: its cells are as its answer left them.
	next := ft.continued(t, r)
	if d := next.Usage.PromptTokensDetails; d == nil || d.CachedTokens < ft.promptTokens {
		t.Errorf("the idle slot's answer continued: %+v cached, want its whole prompt (%d tokens)",
			next.Usage.PromptTokensDetails, ft.promptTokens)
	}
	if a, b := ft.turnAlone.Choices[0].Message.Text(), next.Choices[0].Message.Text(); a != b {
		t.Errorf("the idle slot's answer continued reads %q, alone %q", b, a)
	}
	return st.FillerTokens - before, st.PaddedSteps - paddedBefore
}

// greedyWith runs body (not streamed, with logprobs) with the headers hdr (name,
// value, …) and returns its completion's tokens.
func greedyWith(t *testing.T, r *runner, body map[string]any, hdr ...string) []runnerapi.TokenLogprob {
	t.Helper()
	resp := postChat(t, r, body, hdr...)
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Logprobs runnerapi.ChatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 {
		t.Errorf("completion: status %d, %v", resp.StatusCode, err)
		return nil
	}
	return out.Choices[0].Logprobs.Content
}

// parkInOrder leaves prompts[i] cached in slot i: each is admitted while the ones
// before it still generate (the runner counts them busy), so each takes the lowest free
// slot; once all are, their streams are dropped and the runner frees the slots. It
// says which answer ended by itself, and how, where one did before the next prompt
// took its slot (the next would then have taken the freed slot: the slots hold
// something else); "" once all three are parked.
func parkInOrder(t *testing.T, r *runner, prompts []string) string {
	t.Helper()
	release := make(chan struct{})
	var mu sync.Mutex
	var ended []string
	var parked sync.WaitGroup
	defer func() {
		close(release)
		parked.Wait()
		waitFor(t, 30*time.Second, "the parked answers to free their slots", func() bool { return r.status().SlotsBusy == 0 })
	}()
	endedNow := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(ended, "; ")
	}
	for i, prompt := range prompts {
		parked.Add(1)
		go func() {
			defer parked.Done()
			// Long enough to run until dropped: a parked answer that ends by itself is seen.
			chunks, _, done, _ := streamChat(t, r, context.Background(), chatBody(prompt, 1500, true), func(chunk) bool {
				select {
				case <-release:
					return false
				default:
					return true
				}
			})
			if done {
				mu.Lock()
				defer mu.Unlock()
				ended = append(ended, fmt.Sprintf("prompt %d's answer ended by itself (%s, %d chunks)", i, finishReason(chunks), len(chunks)))
			}
		}()
		waitFor(t, 30*time.Second, fmt.Sprintf("prompt %d to take a slot", i), func() bool {
			return endedNow() != "" || r.status().SlotsBusy == i+1
		})
		if e := endedNow(); e != "" {
			return e
		}
	}
	return ""
}

// finishReason is the last finish_reason among chunks ("none" without one).
func finishReason(chunks []chunk) string {
	reason := "none"
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				reason = *ch.FinishReason
			}
		}
	}
	return reason
}

// answerWithIDs streams body (a chat of one choice) asking for the count lines with
// token ids, and returns the answer, its tokens' ids and the prompt's token count.
func answerWithIDs(t *testing.T, r *runner, body map[string]any) (string, []int32, int) {
	t.Helper()
	resp := postChat(t, r, body, runnerapi.HeaderTokenCounts, runnerapi.TokenCountComments,
		runnerapi.HeaderTokenIDs, runnerapi.TokenCountComments)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	var answer strings.Builder
	var ids []int32
	prompt := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(strings.TrimPrefix(line, ": "))
		switch {
		case strings.HasPrefix(line, runnerapi.PromptCountComment+" ") && len(f) >= 2:
			prompt, _ = strconv.Atoi(f[1])
		case strings.HasPrefix(line, runnerapi.TokenCountComment+" ") && len(f) == 4:
			more, err := runnerapi.ParseTokenIDs(f[3])
			if err != nil {
				t.Fatalf("count line %q: %v", line, err)
			}
			ids = append(ids, more...)
		case strings.HasPrefix(line, "data: {"):
			var c runnerapi.ChatCompletionChunk
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c); err != nil {
				t.Fatalf("chunk %q: %v", line, err)
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != nil {
					answer.WriteString(*ch.Delta.Content)
				}
			}
		}
	}
	if len(ids) == 0 || prompt == 0 {
		t.Fatalf("no token ids (%d) or prompt count (%d) in the stream", len(ids), prompt)
	}
	return answer.String(), ids, prompt
}
