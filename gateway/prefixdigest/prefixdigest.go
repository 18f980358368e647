// Package prefixdigest hashes a chat request's conversation into prefix digests (see
// runnerapi.HeaderPrefixDigests): digest 0 covers the conversation's head (its system
// prompt or instructions and its tools' definitions), digest i chains its i-th message
// onto digest i-1. The three chat APIs (chat completions, Responses, Anthropic
// Messages) are read into one canonical conversation first, so one conversation gets
// the same digests through any of them, and a conversation extended by a turn keeps
// the digests of its earlier prefixes. The chain is seeded by the caller's cache
// partition and the deployment, so two tenants, or two models, never share a digest.
//
// A fleet's gateways key the chain with a secret they share (KeyedDigests, an HMAC
// with the key the manager keeps in the gateway's Secret, see callercert): a Mac
// learns the digests of what it is sent, but cannot compute the digest of a prompt it
// was never sent, so it cannot claim to hold another conversation's prefix and draw
// it. Two gateways with the same key compute the same digests.
package prefixdigest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// version names the canonical form; changing the form changes every digest.
const version = "macfleet-prefix-v1"

// Of returns the prefix digests of a chat request body for the caller's cache
// partition ("" for none) and the deployment model, shallowest first, each 16
// lowercase hex digits; at most runnerapi.MaxPrefixDigests, the deepest kept. A body
// that is not a chat request (a text completion, an embedding, malformed JSON) has
// none.
func Of(partition, model string, body []byte) []string {
	c, ok := Parse(body)
	if !ok {
		return nil
	}
	return c.Digests(partition, model)
}

// Routable returns the digests of c, as Digests gave them, that name a prefix worth
// routing by: all of them but digest 0 when the head is empty (no system prompt, no
// tools). Every conversation of a partition without a head shares that digest, and
// what a replica holds under it is no prefix of this conversation beyond the chat
// template's first tokens; routing by it would send every such conversation to the
// replica that served the first.
func (c Conversation) Routable(digests []string) []string {
	if c.System == "" && len(c.Tools) == 0 && len(digests) == len(c.Messages)+1 {
		return digests[1:]
	}
	return digests
}

// Digests chains c's digests (see Of), unkeyed: anyone who knows the conversation can
// compute them. A gateway that routes across Macs uses KeyedDigests.
func (c Conversation) Digests(partition, model string) []string {
	return c.KeyedDigests(nil, partition, model)
}

// KeyedDigests chains c's digests as Digests does, each step an HMAC-SHA-256 with key
// (unkeyed SHA-256 when key is empty). Only 8 of each step's 32 bytes are given out,
// so the digests of a conversation's prefixes do not let anyone without the key
// compute those of its next turn.
func (c Conversation) KeyedDigests(key []byte, partition, model string) []string {
	h := sha256.New()
	if len(key) > 0 {
		h = hmac.New(sha256.New, key)
	}
	var sum [sha256.Size]byte
	write := func(fields ...string) {
		var n [8]byte
		for _, f := range fields {
			binary.BigEndian.PutUint64(n[:], uint64(len(f)))
			h.Write(n[:])
			h.Write([]byte(f))
		}
	}
	h.Write([]byte(version))
	write(partition, model, c.System, strconv.Itoa(len(c.Tools)))
	write(c.Tools...)
	h.Sum(sum[:0])
	out := make([]string, 0, min(len(c.Messages)+1, runnerapi.MaxPrefixDigests))
	skip := max(len(c.Messages)+1-runnerapi.MaxPrefixDigests, 0)
	if skip == 0 {
		out = append(out, hex.EncodeToString(sum[:8]))
	}
	for i, m := range c.Messages {
		h.Reset()
		h.Write(sum[:])
		write(m.Role, m.Text, strconv.Itoa(len(m.ToolCalls)))
		for _, tc := range m.ToolCalls {
			write(tc.Name, tc.Arguments)
		}
		h.Sum(sum[:0])
		if i+1 >= skip {
			out = append(out, hex.EncodeToString(sum[:8]))
		}
	}
	return out
}

// DigestsWith are c's digests for the partition and deployment model keyed by what
// key returns, the key the gateway replicas share: a Mac cannot compute the digest of
// a conversation it was never sent, so it cannot claim one to draw it. None while the
// key has not loaded (the request is routed as if no replica held a prefix of it);
// unkeyed without a key source (key nil).
func (c Conversation) DigestsWith(key func() ([]byte, bool), partition, model string) []string {
	if key == nil {
		return c.Digests(partition, model)
	}
	k, ok := key()
	if !ok {
		return nil
	}
	return c.KeyedDigests(k, partition, model)
}
