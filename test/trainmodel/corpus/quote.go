package corpus

import (
	"math/rand/v2"
	"slices"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// quote is a turn whose answer quotes a long tool result whole: a file read back or
// a search's snippet of several sentences, where toolCall's results are one or two.
// A coding agent's answers copy what its conversation holds (a file, a command's
// output), and speculative decoding's prompt lookup drafts those tokens from the
// prompt (docs/speculative-decoding.md): a model that quotes word for word keeps
// every token drafted there, one that slips a word in a sentence keeps few. The
// shorter results of toolCall alone left the trained model slipping. A corpus holds
// them only when asked (Config.QuoteEvery; the trained test model's corpus has one in
// ten). A candidate trained on quotes of a file that began "The file PATH says:" or
// "PATH contains:", as toolCall's short reads do, answered a coding agent's listing
// "The directory contains parser.rs says: …": a file's name taken for the start of a
// quote. A quote of a file now names no file before it (quoteLeads; docs/testing.md,
// "How it was chosen").
func quote(r *rand.Rand) Conversation {
	var u toolUse
	if chance(r, 0.25) {
		u = searchOf(r, 120, 360)
	} else {
		u = readFileOf(r, 120, 360)
		u.answer = pick(r, quoteLeads) + u.result
	}
	tools := []runnerapi.Tool{u.tool}
	for range r.IntN(3) {
		o := pick(r, families)(r)
		if !slices.ContainsFunc(tools, func(t runnerapi.Tool) bool { return t.Function.Name == o.tool.Function.Name }) {
			tools = append(tools, o.tool)
		}
	}
	r.Shuffle(len(tools), func(i, j int) { tools[i], tools[j] = tools[j], tools[i] })
	var msgs []runnerapi.Message
	if chance(r, 0.3) {
		msgs = append(msgs, msg("system", pick(r, []string{"You are a helpful assistant with tools.",
			"Use the tools when they help.", "You are a coding assistant. Quote what you read exactly."})))
	}
	msgs = append(msgs, callAndAnswer(u, callID(r))...)
	return Conversation{Kind: "quote", Tools: tools, Messages: msgs}
}

// quoteLeads open a quote of a file: none names the file, so that no file's name in
// an answer is followed by a quote's colon.
var quoteLeads = []string{"Here it is, word for word:\n\n", "It reads, word for word:\n\n", "Word for word:\n\n"}
