package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// A request of the workload: one user of one tenant, sent At after the mode's start.
type request struct {
	Tenant, User int
	At           time.Duration
}

// workload is what one routing mode is measured with: each tenant's shared system
// prompt and the requests in arrival order.
type workload struct {
	Systems  []string
	Requests []request
}

// words is the vocabulary of the synthesized prompts: ordinary English, so that a
// real tokenizer splits them as it splits prose (about 1.3 tokens a word).
var words = strings.Fields(`the a an of to in for on with by from at as is are was be been
it this that these those which who what when where how why not no all any each every some
system user assistant model request answer question review code function method type value
error result file line test build release deploy cluster node replica gateway agent runner
cache prefix memory disk network latency throughput token prompt context window budget quota
tenant team project service endpoint policy rule check report metric trace log event queue
always never only also then else first last next before after during until while because
must should may can will would could read write send receive keep drop move copy restore
fast slow large small short long new old same other more less most least better worse
careful clear exact simple honest precise brief complete correct safe stable secure
document explain describe summarize compare measure estimate decide choose follow refuse`)

// systemPrompt is tenant t's shared system prompt of about n words: sentences of the
// vocabulary drawn from a generator seeded by (seed, t), so two tenants (and two modes,
// which get different seeds) never share more than a few leading tokens.
func systemPrompt(seed uint64, t, n int) string {
	r := rand.New(rand.NewPCG(seed, uint64(t)+1))
	var b strings.Builder
	b.WriteString("You are the assistant of team ")
	b.WriteString(words[r.IntN(len(words))])
	b.WriteString(". ")
	for i := 0; i < n; {
		l := 6 + r.IntN(10)
		for j := 0; j < l && i < n; j, i = j+1, i+1 {
			w := words[r.IntN(len(words))]
			if j == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			b.WriteString(w)
			if j < l-1 && i < n-1 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(". ")
	}
	return strings.TrimSpace(b.String())
}

// userMessage is user u of tenant t's short question: unique to the pair.
func userMessage(t, u int) string {
	return "I am user " + strconv.Itoa(u) + " of team " + strconv.Itoa(t) + ". In two words: which rule above matters most for request " +
		strconv.Itoa(t*1000+u) + "?"
}

// schedule is the arrivals of tenants × users requests as a Poisson stream of rate
// per second: exponential gaps, the (tenant, user) pairs in a random order, both from
// a generator seeded by seed. The last arrival is capped at limit (later gaps shrink
// to fit), so a mode's offered load ends in bounded time.
func schedule(seed uint64, tenants, users int, rate float64, limit time.Duration) []request {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	reqs := make([]request, 0, tenants*users)
	for t := range tenants {
		for u := range users {
			reqs = append(reqs, request{Tenant: t, User: u})
		}
	}
	r.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	var at time.Duration
	for i := range reqs {
		if i > 0 {
			at += time.Duration(r.ExpFloat64() / rate * float64(time.Second))
		}
		reqs[i].At = min(at, limit)
	}
	return reqs
}
