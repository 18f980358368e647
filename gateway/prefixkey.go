package gateway

import "github.com/macfleet/macfleet/gateway/prefixdigest"

// prefixDigests are c's prefix digests for the partition and deployment model, keyed
// by the key the gateway replicas share (Options.PrefixDigestKey): a Mac cannot
// compute the digest of a conversation it was never sent, so it cannot claim one to
// draw it. None while the key has not loaded (the request is routed as if no replica
// held a prefix of it); unkeyed without a key source.
func (g *Gateway) prefixDigests(c prefixdigest.Conversation, partition, model string) []string {
	if g.opts.PrefixDigestKey == nil {
		return c.Digests(partition, model)
	}
	key, ok := g.opts.PrefixDigestKey()
	if !ok {
		return nil
	}
	return c.KeyedDigests(key, partition, model)
}
