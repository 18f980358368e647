package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/localfleet"
)

// budgetResult is one budget phase: S streams at once from one key against its
// TokenBudget, through one gateway or split over several.
type budgetResult struct {
	Gateways, Streams int
	// Later is how long after the first gateway's streams the others' start.
	Later   time.Duration
	Minute  time.Time
	Elapsed time.Duration
	// Served streams, by gateway; Refused ended with the budget's 429 naming the next
	// window; Retries are 429s whose Retry-After (the room held by requests in
	// flight) was waited and the stream asked again.
	Served   []int
	Refused  int
	Retries  int
	Failed   int
	LastFail string
	// Tokens is the served streams' usage; Ledger the gateways' TokenUsage records'
	// tokens of the key in the minute.
	Tokens, Ledger int64
	// Ask is one stream's ask as a refusal names it.
	Ask int64
	// Crossed: the phase ran into the next minute, where the budget starts afresh.
	Crossed bool
}

func (r budgetResult) laterText() string {
	if r.Later == 0 {
		return ""
	}
	return fmt.Sprintf(", the second's streams %v later", r.Later)
}

func (r budgetResult) served() (n int) {
	for _, s := range r.Served {
		n += s
	}
	return n
}

// phaseRoom is how much of a minute a budget phase needs: it starts only with that
// much left, and stops retrying 10 s before the minute ends.
const phaseRoom = 30 * time.Second

// laterBy is how much later the second gateway's streams start in the third budget
// phase: past the ledger's flush interval (200 ms) and the watch that brings a
// replica's record to the other.
const laterBy = time.Second

// budgetPhase sends o.streams streams of o.choices choices from key, stream i through
// urls[i % len(urls)], those through urls[0] at once and the others later, each
// retried while a refusal says the requests in flight hold the room (Retry-After ≤
// 1 s) until 10 s before the minute ends.
func budgetPhase(ctx context.Context, o options, fl *benchFleet, key string, urls []string, later time.Duration) (budgetResult, error) {
	minute, err := waitMinute(ctx)
	if err != nil {
		return budgetResult{}, err
	}
	r := budgetResult{Gateways: len(urls), Streams: o.streams, Later: later, Minute: minute, Served: make([]int, len(urls))}
	fmt.Fprintf(o.out, "budget: %d streams of n=%d, max_tokens %d, against %d tokens a minute, over %d gateway(s)%s; load %s\n",
		o.streams, o.choices, o.maxTokens, o.budget, len(urls), r.laterText(), localfleet.LoadAverage())
	hc := from("127.0.0.1", true, o.streams)
	// Its kept-alive connections would count against 127.0.0.1's cap in the idle phase.
	defer hc.CloseIdleConnections()
	clients := make([]openai.Client, len(urls))
	for i, u := range urls {
		clients[i] = openai.NewClient(option.WithBaseURL(u+"/v1/"), option.WithAPIKey(fl.keys[key]),
			option.WithMaxRetries(0), option.WithHTTPClient(hc))
	}
	params := openai.ChatCompletionNewParams{Model: deployName, N: openai.Int(int64(o.choices)),
		MaxTokens: openai.Int(int64(o.maxTokens)), Temperature: openai.Float(1),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about the sea.")}}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
		stop  = minute.Add(time.Minute - 10*time.Second)
	)
	for i := range o.streams {
		wg.Go(func() {
			<-start
			g := i % len(urls)
			if g > 0 && sleep(ctx, later) != nil {
				return
			}
			out := streamUntilDone(ctx, clients[g], params, stop)
			mu.Lock()
			defer mu.Unlock()
			r.Retries += out.retries
			switch {
			case out.err != nil:
				r.Failed++
				r.LastFail = out.err.Error()
			case out.refused:
				r.Refused++
			default:
				r.Served[g]++
				r.Tokens += out.tokens
			}
			if out.ask > 0 {
				r.Ask = out.ask
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	r.Elapsed = time.Since(began)
	r.Crossed = !time.Now().UTC().Truncate(time.Minute).Equal(minute)
	r.Ledger, err = ledgerTokens(ctx, fl.f.Client, key, minute, r.Tokens)
	fmt.Fprintf(o.out, "budget over %d gateway(s)%s: %d served %v, %d refused, %d retries, %d failed; %d tokens served (%.0f %% of %d), ledger %d\n",
		len(urls), r.laterText(), r.served(), r.Served, r.Refused, r.Retries, r.Failed, r.Tokens, percent(r.Tokens, o.budget), o.budget, r.Ledger)
	return r, err
}

// waitMinute waits until phaseRoom is left in the current UTC minute, and returns it.
func waitMinute(ctx context.Context) (time.Time, error) {
	for {
		now := time.Now().UTC()
		minute := now.Truncate(time.Minute)
		if now.Sub(minute) <= time.Minute-phaseRoom {
			return minute, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(minute.Add(time.Minute).Sub(now)):
		}
	}
}

// streamOutcome is one stream's end: served with its usage, or refused, after
// retries; ask is what a refusal said the stream may use.
type streamOutcome struct {
	tokens, ask int64
	refused     bool
	retries     int
	err         error
}

// streamUntilDone streams params through c until it is served, refused for its window
// (or for the room held in flight past stop) or fails; at most 100 tries.
func streamUntilDone(ctx context.Context, c openai.Client, params openai.ChatCompletionNewParams, stop time.Time) (out streamOutcome) {
	for range 100 {
		var retry time.Duration
		out.tokens, out.ask, retry, out.err = streamOnce(ctx, c, params)
		switch {
		case out.err != nil || retry == 0:
			return out
		case retry > time.Second || time.Now().Add(retry).After(stop):
			out.refused = true
			return out
		}
		out.retries++
		select {
		case <-ctx.Done():
			out.err = ctx.Err()
			return out
		case <-time.After(retry):
		}
	}
	out.err = errors.New("100 refusals with a short Retry-After in a row")
	return out
}

var askRE = regexp.MustCompile(`this request (?:may use up to|needs at least) (\d+)`)

// streamOnce streams params once: its usage, or the budget's refusal (its Retry-After
// and the ask it names).
func streamOnce(ctx context.Context, c openai.Client, params openai.ChatCompletionNewParams) (tokens, ask int64, retry time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s := c.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	for s.Next() {
		if u := s.Current().Usage; u.TotalTokens > 0 {
			tokens = u.TotalTokens
		}
	}
	var apiErr *openai.Error
	switch err := s.Err(); {
	case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests && apiErr.Code == "token_budget_exceeded":
		secs, perr := strconv.Atoi(apiErr.Response.Header.Get("Retry-After"))
		if perr != nil || secs < 1 {
			return 0, 0, 0, fmt.Errorf("a budget refusal without a Retry-After in seconds: %q", apiErr.Response.Header.Get("Retry-After"))
		}
		if m := askRE.FindStringSubmatch(apiErr.Message); m != nil {
			ask, _ = strconv.ParseInt(m[1], 10, 64)
		}
		return 0, ask, time.Duration(secs) * time.Second, nil
	case err != nil:
		return 0, 0, 0, err
	case tokens == 0:
		return 0, 0, 0, errors.New("a stream ended without its usage")
	}
	return tokens, 0, 0, nil
}

// ledgerTokens is the tokens the gateways' TokenUsage records count for key in
// minute, read once they count want (the records are written within 200 ms of a
// change), or after 10 s whatever they count.
func ledgerTokens(ctx context.Context, c client.Client, key string, minute time.Time, want int64) (int64, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var l v1alpha1.TokenUsageList
		if err := c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
			return 0, fmt.Errorf("listing TokenUsages: %w", err)
		}
		var n int64
		for _, tu := range l.Items {
			for _, w := range tu.Spec.Windows {
				if w.Key == key && w.Minute != nil && w.Minute.UTC().Equal(minute) {
					n += w.MinuteTokens
				}
			}
		}
		if n == want || time.Now().After(deadline) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// percent is 100 × a / b.
func percent(a, b int64) float64 { return 100 * float64(a) / float64(b) }
