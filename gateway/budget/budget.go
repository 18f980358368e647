// Package budget decides whether a caller's request fits the TokenBudgets that apply
// to it: its namespace's (spec.key unset) and its own key's. It is pure: the gateway
// gives it the budgets, this replica's own exact counts, what the other gateway
// replicas published in their TokenUsage records, and the time.
//
// Tokens are input plus output. The windows are fixed UTC minutes, hours and days;
// a window's count starts afresh at its boundary. A request's size is not known
// before it is answered, so it is admitted for the most it can use (its Request: its
// prompt's estimate plus each choice's cap × n), reserved until it ends: a request is
// admitted while, in every window it falls in, the tokens used plus those reserved by
// the requests in flight plus its own stay within the limit, and while fewer
// requests than concurrentRequests are in flight. A request that asks for more than
// the room left (the limit less what was used and reserved) is capped: each of its
// choices may generate (room − prompt) / n tokens, at least one, and the gateway
// lowers its max_tokens to that (Decision.Cap). One whose prompt's estimate with a
// token a choice is over the room waits for the requests in flight to end, or for
// the next window; over a whole limit, it is admitted only into that window empty
// (nothing used, nothing reserved), with one token a choice, and then holds all of
// it. When a request ends its reservation is settled: replaced by the usage its
// answer reported.
//
// So a window serves at most its limit, or, when one request's prompt is estimated
// over the whole limit, that one request's prompt and a token a choice; plus what
// prompts use beyond their estimates (PromptBytesPerToken).
package budget

import (
	"fmt"
	"math"
	"time"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/metering"
)

// Window is what a limit counts.
type Window string

// The windows of a TokenBudget.
const (
	Minute     Window = "minute"
	Hour       Window = "hour"
	Day        Window = "day"
	Concurrent Window = "concurrent"
)

// StaleAfter is how old a replica's published record may be before its requests in
// flight are no longer counted: a replica that stopped renewing has stopped, or lost
// the API server. Its tokens still count in the windows they were used in.
const StaleAfter = 15 * time.Second

// Start is the start of the UTC window w that holds t.
func Start(w Window, t time.Time) time.Time {
	t = t.UTC()
	switch w {
	case Minute:
		return t.Truncate(time.Minute)
	case Hour:
		return t.Truncate(time.Hour)
	default:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	}
}

// end is when the window w that holds t ends.
func end(w Window, t time.Time) time.Time {
	s := Start(w, t)
	switch w {
	case Minute:
		return s.Add(time.Minute)
	case Hour:
		return s.Add(time.Hour)
	default:
		return s.AddDate(0, 0, 1)
	}
}

// Tally is one party's count of one scope (a key, or a whole namespace): the tokens
// of the minute, hour and day that start at Minute, Hour and Day, its requests in
// flight and the tokens they reserved. A window that is not the current one counts
// nothing; reserved tokens count in every current window, whichever one the
// requests started in (they are charged in the one they end in).
type Tally struct {
	Minute       time.Time
	MinuteTokens int64
	Hour         time.Time
	HourTokens   int64
	Day          time.Time
	DayTokens    int64
	InFlight     int64
	Reserved     int64
}

// tokens is what t counts in the window w that starts at start.
func (t Tally) tokens(w Window, start time.Time) int64 {
	switch {
	case w == Minute && t.Minute.Equal(start):
		return t.MinuteTokens
	case w == Hour && t.Hour.Equal(start):
		return t.HourTokens
	case w == Day && t.Day.Equal(start):
		return t.DayTokens
	}
	return 0
}

// Add counts tokens used at now into t, first moving each window to now's.
func (t *Tally) Add(now time.Time, tokens int64) {
	for _, w := range [...]struct {
		win    Window
		start  *time.Time
		tokens *int64
	}{{Minute, &t.Minute, &t.MinuteTokens}, {Hour, &t.Hour, &t.HourTokens}, {Day, &t.Day, &t.DayTokens}} {
		if s := Start(w.win, now); !w.start.Equal(s) {
			*w.start, *w.tokens = s, 0
		}
		*w.tokens = metering.AddCount(*w.tokens, tokens)
	}
}

// Peer is what another gateway replica published about one namespace (its
// TokenUsage record of the day): per key, and the namespace's sum.
type Peer struct {
	Gateway string
	Renewed time.Time
	Keys    map[string]Tally
	Total   Tally
}

// PeerFrom reads a TokenUsage record. Its counts are held within [0,
// metering.MaxCount] and summed without wrapping: a record written before the schema
// bounded them cannot lift a budget by counting negative.
func PeerFrom(tu *mfv1.TokenUsage) Peer {
	p := Peer{Gateway: tu.Spec.Gateway, Keys: map[string]Tally{}}
	if tu.Spec.RenewTime != nil {
		p.Renewed = tu.Spec.RenewTime.Time
	}
	day, err := time.Parse(time.DateOnly, tu.Spec.Day)
	if err != nil {
		day = time.Time{} // counts in no day
	}
	add := func(k string, f func(*Tally)) {
		t := p.Keys[k]
		f(&t)
		p.Keys[k] = t
	}
	for _, u := range tu.Spec.Usage {
		n := metering.AddCount(u.InputTokens, u.OutputTokens)
		add(u.Key, func(t *Tally) { t.Day, t.DayTokens = day, metering.AddCount(t.DayTokens, n) })
		p.Total.Day, p.Total.DayTokens = day, metering.AddCount(p.Total.DayTokens, n)
	}
	for _, w := range tu.Spec.Windows {
		add(w.Key, func(t *Tally) {
			if w.Minute != nil {
				t.Minute, t.MinuteTokens = w.Minute.UTC(), metering.Count(w.MinuteTokens)
			}
			if w.Hour != nil {
				t.Hour, t.HourTokens = w.Hour.UTC(), metering.Count(w.HourTokens)
			}
			t.InFlight = int64(max(w.InFlight, 0))
			t.Reserved = metering.Count(w.ReservedTokens)
		})
		p.Total.InFlight += int64(max(w.InFlight, 0))
		p.Total.Reserved = metering.AddCount(p.Total.Reserved, metering.Count(w.ReservedTokens))
	}
	// The namespace's minute and hour are the latest any key counts in: a key's
	// earlier window is over.
	for _, t := range p.Keys {
		if t.Minute.After(p.Total.Minute) {
			p.Total.Minute = t.Minute
		}
		if t.Hour.After(p.Total.Hour) {
			p.Total.Hour = t.Hour
		}
	}
	for _, t := range p.Keys {
		p.Total.MinuteTokens = metering.AddCount(p.Total.MinuteTokens, t.tokens(Minute, p.Total.Minute))
		p.Total.HourTokens = metering.AddCount(p.Total.HourTokens, t.tokens(Hour, p.Total.Hour))
	}
	return p
}

// Own is this replica's exact counts for a caller: its key's and its namespace's.
type Own struct {
	Key, Namespace Tally
}

// Decision says whether a request is admitted and, when it is not, which budget and
// window refused it.
type Decision struct {
	Allowed bool
	// Budget is the refusing TokenBudget as namespace/name.
	Budget string
	Window Window
	Limit  int64
	// Used is the window's tokens used (for Concurrent, the requests in flight);
	// Reserved the tokens the requests in flight reserved; Ask the request's own: of
	// a refused one, the least it needs (its prompt's estimate and a token a choice,
	// or its whole ask when it cannot be capped); of one admitted capped, what it
	// reserves.
	Used, Reserved, Ask int64
	// Cap, of a request admitted capped, is each choice's new cap on its output (0:
	// not capped, it runs as asked).
	Cap int64
	// Leased: the window's room is held by the other replicas' leases (Used is
	// what they used or hold, Ask what this replica needs with the request).
	Leased bool
	// Reset is when the window starts afresh, or, when the window has room once the
	// requests in flight end, when to try again.
	Reset time.Time
}

// ConcurrentRetry is when a request refused for its concurrent requests, or for the
// tokens the requests in flight reserved, is told to try again: requests end at any
// time.
const ConcurrentRetry = time.Second

// RetryAfter is the whole seconds from now until d's window resets, at least one.
func (d Decision) RetryAfter(now time.Time) time.Duration {
	s := math.Ceil(d.Reset.Sub(now).Seconds())
	return time.Duration(max(s, 1)) * time.Second
}

// Message is d's refusal in words, for the error body.
func (d Decision) Message() string {
	switch {
	case d.Leased:
		return d.leasedMessage()
	case d.Window == Concurrent:
		return fmt.Sprintf("TokenBudget %s allows %d concurrent requests and %d are in flight: try again when one ends",
			d.Budget, d.Limit, d.Used)
	case d.Ask > d.Limit && d.Used < d.Limit && d.Reserved > 0:
		return fmt.Sprintf("TokenBudget %s allows %d tokens per %s and this request needs at least %d "+
			"(its prompt's estimate and a token per choice), so it runs only alone in a window: "+
			"%d were used and %d are reserved by requests in flight: try again when they end, or send a shorter prompt",
			d.Budget, d.Limit, d.Window, d.Ask, d.Used, d.Reserved)
	case d.Used < d.Limit && d.Used+d.Ask <= d.Limit:
		return fmt.Sprintf("TokenBudget %s allows %d tokens per %s: %d were used, %d are reserved by requests in flight "+
			"and this request needs at least %d (its prompt's estimate and a token per choice): try again when they end",
			d.Budget, d.Limit, d.Window, d.Used, d.Reserved, d.Ask)
	}
	return fmt.Sprintf("TokenBudget %s allows %d tokens per %s: %d were used, %d are reserved by requests in flight "+
		"and this request needs at least %d (its prompt's estimate and a token per choice): it resets at %s",
		d.Budget, d.Limit, d.Window, d.Used, d.Reserved, d.Ask, d.Reset.UTC().Format(time.RFC3339))
}

// Decide is Fit for a request whose whole ask is fixed (it cannot be capped): ask
// tokens.
func Decide(budgets []mfv1.TokenBudget, key string, ask int64, own Own, peers []Peer, now time.Time) Decision {
	return Fit(budgets, key, Request{Prompt: ask}, own, peers, now)
}

// Fit checks req against the budgets of the caller key's namespace that apply to it
// (spec.key unset or equal to key), with own, the peers' records (those of other
// replicas, today's) and now. Admitted, its Cap is the least any window allows (0:
// none caps it). Of several refusals it names the one that resets last, so a client
// that waits for it finds room.
func Fit(budgets []mfv1.TokenBudget, key string, req Request, own Own, peers []Peer, now time.Time) Decision {
	if req.Tokens() < 1 {
		req.Prompt = 1 // every request counts, one that runs no sequence too
	}
	var worst Decision
	capped := int64(0)
	for i := range budgets {
		b := &budgets[i]
		if b.Spec.Key != "" && b.Spec.Key != key {
			continue
		}
		d := check(b, key, req, own, peers, now)
		switch {
		case !d.Allowed && (worst.Budget == "" || d.Reset.After(worst.Reset)):
			worst = d
		case d.Allowed && d.Cap > 0 && (capped == 0 || d.Cap < capped):
			capped = d.Cap
		}
	}
	switch {
	case worst.Budget != "":
		return worst
	case capped > 0:
		req.Output = capped
		return Decision{Allowed: true, Cap: capped, Ask: req.Tokens()}
	}
	return Decision{Allowed: true}
}

// check is Fit for one budget: the first of its windows the request does not fit, or
// the least cap its windows need.
func check(b *mfv1.TokenBudget, key string, req Request, own Own, peers []Peer, now time.Time) Decision {
	scope := func(p Peer) Tally {
		if b.Spec.Key == "" {
			return p.Total
		}
		return p.Keys[key]
	}
	mine := own.Namespace
	if b.Spec.Key != "" {
		mine = own.Key
	}
	// What the requests in flight hold: this replica's, and those of the peers that
	// still renew their records (a stopped one's requests ended with it).
	inFlight, reserved := mine.InFlight, mine.Reserved
	for _, p := range peers {
		if now.Sub(p.Renewed) <= StaleAfter {
			inFlight += scope(p).InFlight
			reserved = metering.AddCount(reserved, scope(p).Reserved)
		}
	}
	name := b.Namespace + "/" + b.Name
	capped := int64(0)
	for _, l := range [...]struct {
		w     Window
		limit *int64
	}{{Day, b.Spec.TokensPerDay}, {Hour, b.Spec.TokensPerHour}, {Minute, b.Spec.TokensPerMinute}} {
		if l.limit == nil {
			continue
		}
		start := Start(l.w, now)
		used := mine.tokens(l.w, start)
		for _, p := range peers {
			used = metering.AddCount(used, scope(p).tokens(l.w, start))
		}
		d := Decision{Budget: name, Window: l.w, Limit: *l.limit, Used: used, Reserved: reserved, Ask: req.least(),
			Reset: end(l.w, now)}
		c, ok := req.fit(*l.limit, used, reserved)
		switch {
		case !ok && (used >= *l.limit || used > 0 && metering.AddCount(used, req.least()) > *l.limit):
			return d // the window is spent for it
		case !ok:
			d.Reset = now.Add(ConcurrentRetry) // room comes back as the requests in flight end
			return d
		case c > 0 && (capped == 0 || c < capped):
			capped = c
		}
	}
	if c := b.Spec.ConcurrentRequests; c != nil && inFlight >= int64(*c) {
		return Decision{Budget: name, Window: Concurrent, Limit: int64(*c), Used: inFlight, Reset: now.Add(ConcurrentRetry)}
	}
	return Decision{Allowed: true, Cap: capped}
}

// Request is what a request may use, as the budgets count it before it is answered
// (Estimate): its prompt's estimate, and Choices outputs of at most Output tokens
// each.
type Request struct {
	Prompt int64
	// Choices is how many outputs it generates that the gateway can cap (n); 0 for
	// one that generates nothing, or whose output the gateway cannot cap (then its
	// bound is in Prompt).
	Choices int64
	// Output is each choice's cap: its max_tokens, or without one a slot of the
	// context (what the runner generates at most).
	Output int64
}

// Tokens is the most r uses.
func (r Request) Tokens() int64 {
	return metering.AddCount(r.Prompt, metering.Count(mulCount(r.Choices, r.Output)))
}

// least is the least r can be capped to: its prompt and a token a choice.
func (r Request) least() int64 {
	return metering.AddCount(r.Prompt, min(r.Tokens()-r.Prompt, max(r.Choices, 0)))
}

// fit is whether r fits a window of limit with used tokens used and reserved
// reserved, and each choice's cap it needs there (0: none). Over the room left it is
// capped to (room − prompt) / choices, down to a token a choice; a prompt that does
// not fit with that runs only alone, in an empty window, with a token a choice.
func (r Request) fit(limit, used, reserved int64) (capped int64, ok bool) {
	room := limit - metering.AddCount(used, reserved)
	switch {
	case used >= limit:
		return 0, false
	case r.Tokens() <= room:
		return 0, true
	case r.least() <= room:
		return (room - r.Prompt) / r.Choices, true // r.least() < r.Tokens(): Choices > 0
	case used == 0 && reserved == 0: // alone in the window
		if r.least() < r.Tokens() {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// mulCount is a × b for counts, at most metering.MaxCount.
func mulCount(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > metering.MaxCount/b {
		return metering.MaxCount
	}
	return a * b
}

// PromptBytesPerToken is how many bytes of a request's body the prompt's estimate
// counts as one token. The gateway does not tokenize: every piece of a prompt's
// text sits in the body with its JSON quoting and field names, and tokenizers merge
// text at several bytes a token, so a body's bytes over 2 is above its prompt's
// tokens for the texts we serve; a prompt of bytes no tokenizer merges may use up to
// twice its estimate, which its settlement then charges.
const PromptBytesPerToken = 2

// Estimate is what a request with limits lim and a body of bodyBytes may use: its
// prompt's estimate (bodyBytes / PromptBytesPerToken, at most what its sequences
// hold) and its output's bound (max_tokens per choice; without max_tokens, the
// context per choice: what the runner would generate at most).
func Estimate(lim metering.Limits, bodyBytes int) Request {
	b := lim.Bound()
	r := Request{Prompt: min(int64(bodyBytes)/PromptBytesPerToken+1, b.Input)}
	if b.Output > 0 && lim.Sequences > 0 {
		r.Choices, r.Output = lim.Sequences, b.Output/lim.Sequences
	}
	return r
}
