package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Request kinds.
const (
	ChatStream = "chat-stream"
	Chat       = "chat"
	Embeddings = "embeddings"
	ColdStart  = "cold-start"
)

// Outcome is how a request ended.
type Outcome int

const (
	// Succeeded: a complete, well-formed answer.
	Succeeded Outcome = iota
	// FailedBeforeFirstByte: no byte of an answer arrived, retries included. The
	// fleet promises this never happens: a lost request.
	FailedBeforeFirstByte
	// BrokenMidStream: the answer started and then broke (a killed runner, agent or
	// gateway in the middle of it). Counted, not a failure.
	BrokenMidStream
)

// Classify is the outcome of a request that ended with err, after bytes of an answer
// arrived or not.
func Classify(err error, answered bool) Outcome {
	switch {
	case err == nil:
		return Succeeded
	case answered:
		return BrokenMidStream
	default:
		return FailedBeforeFirstByte
	}
}

// Counts are the requests of one kind.
type Counts struct {
	Sent, Succeeded, FailedBeforeFirstByte, BrokenMidStream int
	// Retries are the client's retries (after 429, 5xx and connection errors).
	Retries int
}

func (c *Counts) add(o Counts) {
	c.Sent += o.Sent
	c.Succeeded += o.Succeeded
	c.FailedBeforeFirstByte += o.FailedBeforeFirstByte
	c.BrokenMidStream += o.BrokenMidStream
	c.Retries += o.Retries
}

// Stats are the traffic's counts by kind and the errors of the requests that did not
// succeed.
type Stats struct {
	mu     sync.Mutex
	kinds  map[string]*Counts
	errors []string
}

// maxErrors bounds the errors Stats keeps.
const maxErrors = 50

// Record counts one request.
func (s *Stats) Record(kind string, o Outcome, retries int, at time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kinds == nil {
		s.kinds = map[string]*Counts{}
	}
	c := s.kinds[kind]
	if c == nil {
		c = &Counts{}
		s.kinds[kind] = c
	}
	c.Sent++
	c.Retries += retries
	switch o {
	case Succeeded:
		c.Succeeded++
	case FailedBeforeFirstByte:
		c.FailedBeforeFirstByte++
	case BrokenMidStream:
		c.BrokenMidStream++
	}
	if err != nil && len(s.errors) < maxErrors {
		what := map[Outcome]string{FailedBeforeFirstByte: "LOST", BrokenMidStream: "broken"}[o]
		s.errors = append(s.errors, fmt.Sprintf("%s %s at %s after %d retries: %v", what, kind, at.Round(time.Millisecond), retries, err))
	}
}

// Kinds returns the counts by kind and their total.
func (s *Stats) Kinds() (map[string]Counts, Counts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]Counts{}
	var total Counts
	for k, c := range s.kinds {
		m[k] = *c
		total.add(*c)
	}
	return m, total
}

// Errors are the first errors recorded.
func (s *Stats) Errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errors...)
}

// Traffic is the soak's load: Workers clients sending chat completions (streamed and
// not) and embeddings back to back, and one sending a cold-start request to the
// OnDemand model every ColdEvery, until the deadline or MaxRequests.
type Traffic struct {
	// Gateways are the gateway replicas' base URLs; the clients spread attempts over
	// them, as a load balancer in front of them would.
	Gateways []string
	// Models are the chat, embeddings and OnDemand deployments' names.
	ChatModel, EmbedModel, ColdModel string
	Workers                          int
	ColdEvery                        time.Duration
	MaxRequests                      int64
	// RequestTimeout bounds each request, retries included.
	RequestTimeout time.Duration
	// MaxRetries are the client's retries of one request.
	MaxRetries int
	Seed       uint64
	Stats      Stats

	sent  atomic.Int64
	next  atomic.Uint64
	start time.Time
}

// Run sends the traffic until the deadline, MaxRequests or ctx ends. Requests under
// way at the deadline run to their end (RequestTimeout at most).
func (tr *Traffic) Run(ctx context.Context, deadline time.Time) {
	reqCtx := ctx
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tr.start = time.Now()
	client := tr.client()
	var wg sync.WaitGroup
	for w := range tr.Workers {
		rng := rand.New(rand.NewPCG(tr.Seed, uint64(w)))
		wg.Go(func() {
			for ctx.Err() == nil && tr.sent.Add(1) <= tr.MaxRequests {
				switch p := rng.IntN(10); {
				case p < 4:
					tr.do(reqCtx, client, ChatStream)
				case p < 7:
					tr.do(reqCtx, client, Chat)
				default:
					tr.do(reqCtx, client, Embeddings)
				}
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(tr.ColdEvery)
		defer t.Stop()
		for ctx.Err() == nil && tr.sent.Add(1) <= tr.MaxRequests {
			tr.do(reqCtx, client, ColdStart)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	})
	wg.Wait()
}

// client is the official OpenAI client as the soak uses it.
func (tr *Traffic) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(tr.Gateways[0]+"/v1/"), option.WithAPIKey("soak"),
		option.WithMaxRetries(tr.MaxRetries), option.WithMiddleware(tr.middleware),
		option.WithHTTPClient(&http.Client{Transport: roundTripFunc(tr.balance)}))
}

// attempt is what the middleware saw of one request's attempts.
type attempt struct {
	attempts atomic.Int32
	answered atomic.Bool
}

type attemptKey struct{}

// middleware counts a request's attempts, notes the first byte of an answer, and
// keeps the client from retrying what the fleet answered with an error other than
// 429 and 503: those are the fleet's to retry (the client retries connection errors,
// which only a dead gateway causes here, as a load balancer in front of the gateways
// would).
func (tr *Traffic) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	a, _ := req.Context().Value(attemptKey{}).(*attempt)
	if a != nil {
		a.attempts.Add(1)
	}
	resp, err := next(req)
	if err != nil {
		return resp, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if a != nil {
			resp.Body = &firstByte{ReadCloser: resp.Body, a: a}
		}
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		resp.Header.Set("X-Should-Retry", "false")
	}
	return resp, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// balance sends each attempt to the next gateway.
func (tr *Traffic) balance(req *http.Request) (*http.Response, error) {
	gw, err := url.Parse(tr.Gateways[tr.next.Add(1)%uint64(len(tr.Gateways))])
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = gw.Scheme, gw.Host, gw.Host
	return http.DefaultTransport.RoundTrip(req)
}

type firstByte struct {
	io.ReadCloser
	a *attempt
}

func (b *firstByte) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.a.answered.Store(true)
	}
	return n, err
}

func (tr *Traffic) do(ctx context.Context, c openai.Client, kind string) {
	a := &attempt{}
	rctx, cancel := context.WithTimeout(context.WithValue(ctx, attemptKey{}, a), tr.RequestTimeout)
	defer cancel()
	at := time.Since(tr.start)
	err := tr.send(rctx, c, kind)
	if err != nil && ctx.Err() != nil {
		return // the test ended: not a request the fleet lost
	}
	retries := max(int(a.attempts.Load())-1, 0)
	tr.Stats.Record(kind, Classify(err, a.answered.Load()), retries, at, err)
}

func (tr *Traffic) send(ctx context.Context, c openai.Client, kind string) error {
	model := tr.ChatModel
	switch kind {
	case Embeddings:
		resp, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: tr.EmbedModel,
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("the soak of a fleet")}})
		if err == nil && (len(resp.Data) != 1 || len(resp.Data[0].Embedding) == 0) {
			err = fmt.Errorf("embeddings answer without an embedding: %+v", resp)
		}
		return err
	case ColdStart:
		model = tr.ColdModel
	}
	params := openai.ChatCompletionNewParams{
		Model:       model,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell the fleet a story")},
		MaxTokens:   openai.Int(16),
		Temperature: openai.Float(0),
	}
	if kind == Chat {
		resp, err := c.Chat.Completions.New(ctx, params)
		if err == nil && (len(resp.Choices) != 1 || resp.Usage.CompletionTokens == 0) {
			err = fmt.Errorf("chat answer without a completion: %+v", resp)
		}
		return err
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	var usage int64
	for s.Next() {
		if u := s.Current().Usage; u.CompletionTokens > 0 {
			usage = u.CompletionTokens
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	if usage == 0 {
		return errors.New("the stream ended without its usage chunk")
	}
	return nil
}
