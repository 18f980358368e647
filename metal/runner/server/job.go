//go:build cgo && !race

package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// job is one unit of work for the engine: a generation (chat or text completion) or
// one embedding input. The engine goroutine produces its output; the HTTP handler
// consumes it. The engine never blocks on a job: output accumulates under the job's
// mutex and a notification channel of capacity one wakes the handler.
type job struct {
	ctx    context.Context
	embed  bool
	tokens []int32
	opts   runnerapi.Options
	// restore is a cached state of a prefix of tokens (set before submit; the engine
	// takes it at admission).
	restore *restoreState
	// partition is the prompt cache partition the job may reuse and fill.
	partition string
	// digests are the request's prefix digests (runnerapi.HeaderPrefixDigests), told
	// to the prefix table with the state the job's slot saves.
	digests []string
	// special maps control tokens to the text to emit for them (tool-call and
	// reasoning markers); other control tokens emit nothing.
	special map[int32][]byte
	// grammarPrefix is the answer a continuation starts from, which the output's
	// grammar (opts.Grammar) is advanced past before the first token.
	grammarPrefix string
	// held are a continued answer's last tokens whose text its client never got: the
	// output starts with their text (pushed before the first token's).
	held []int32
	// images are the prompt's images, in order (vision.go): tokens holds stand-in ids
	// at their positions, which the engine evaluates through the projector.
	images []promptImage
	// keys are the block keys of the prompt, hold the job's wait on a slot prefilling
	// a prompt it shares, holdChecked whether it looked for one (engine goroutine only:
	// see engine_inflight.go).
	// noSpec turns speculative decoding off for the job, forceSpec drafts wherever
	// the slot's policy finds a draft, paid or not; neither: where the engine's step
	// times say drafts pay (runnerapi.HeaderSpeculation; engine_speculate.go's planDrafts).
	noSpec, forceSpec bool
	// predicted are the tokens of the request's prediction, which the slot drafts
	// from before its own history (runnerapi.Options.Predicted).
	predicted   []int32
	keys        []promptcache.Key
	hold        *jobHold
	holdChecked bool

	notify chan struct{}

	mu        sync.Mutex
	text      strings.Builder // produced but not yet taken by the handler
	logprobs  []runnerapi.TokenLogprob
	ids       []int32 // the generated tokens not yet taken (runnerapi.HeaderTokenIDs)
	done      bool
	finish    string           // stop or length, when done without error
	stopSeq   string           // the stop string that ended the generation
	err       *runnerapi.Error // when done with an error
	generated int              // completion tokens
	cached    int              // prompt tokens reused from the slot's KV cache
	embedding []float32
	firstAt   time.Time // first generated token
	times     jobTimes
	link      *jobLink // a split runner's link figures (nil: not split)
	// accepted and rejected count the drafted tokens the verify kept and dropped.
	accepted, rejected int
}

// jobTimes are when a job passed each stage, for its trace spans.
type jobTimes struct {
	submitted, admitted, ended time.Time
	// restored prompt tokens from the prompt cache at admission, and how long that took.
	restored    int
	restoreTook time.Duration
}

func newJob(ctx context.Context, tokens []int32, opts runnerapi.Options, embed bool) *job {
	return &job{ctx: ctx, tokens: tokens, opts: opts, embed: embed, notify: make(chan struct{}, 1),
		times: jobTimes{submitted: time.Now()}}
}

func (j *job) wake() {
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// noToken is emit's tok for text that no new token brings (what a stream held back).
const noToken = -1

// emit appends generated text and the token tok that brought it (noToken: none), with
// its logprob when asked for; ignored once the job is done.
func (j *job) emit(text string, tok int32, lp *runnerapi.TokenLogprob) {
	j.mu.Lock()
	if !j.done {
		j.text.WriteString(text)
		if lp != nil {
			j.logprobs = append(j.logprobs, *lp)
		}
		if tok != noToken {
			j.generated++
			j.ids = append(j.ids, tok)
			if j.firstAt.IsZero() {
				j.firstAt = time.Now()
			}
		}
	}
	j.mu.Unlock()
	j.wake()
}

// complete ends the job successfully; it reports false if it had already ended.
func (j *job) complete(finish string) bool {
	j.mu.Lock()
	ok := !j.done
	if ok {
		j.done, j.finish = true, finish
		j.times.ended = time.Now()
	}
	j.mu.Unlock()
	j.wake()
	return ok
}

// fail ends the job with err; it reports false if it had already ended.
func (j *job) fail(err *runnerapi.Error) bool {
	j.mu.Lock()
	ok := !j.done
	if ok {
		j.done, j.err = true, err
		j.times.ended = time.Now()
	}
	j.mu.Unlock()
	j.wake()
	return ok
}

// finished reports whether the job has ended or its client has gone.
func (j *job) finished() bool {
	if j.ctx.Err() != nil {
		return true
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done
}

// update is what a handler takes from the job at one wake-up.
type update struct {
	text      string
	logprobs  []runnerapi.TokenLogprob
	ids       []int32 // the tokens generated since the last update
	done      bool
	finish    string
	err       *runnerapi.Error
	generated int
	cached    int
	stopSeq   string
	// accepted and rejected count speculative decoding's drafted tokens.
	accepted, rejected int
}

func (j *job) take() update {
	j.mu.Lock()
	defer j.mu.Unlock()
	u := update{text: j.text.String(), logprobs: j.logprobs, ids: j.ids, done: j.done, finish: j.finish, err: j.err,
		generated: j.generated, cached: j.cached, stopSeq: j.stopSeq, accepted: j.accepted, rejected: j.rejected}
	j.text.Reset()
	j.logprobs, j.ids = nil, nil
	return u
}
