package promptcache

import "context"

// Tier says where a state was found.
type Tier string

const (
	TierNone Tier = ""
	TierHot  Tier = "hot"
	TierSSD  Tier = "ssd"
)

// Cache puts the tiers together for one runner (one identity). SSD may be nil (no
// SSD tier). Saves write through to both tiers, so clearing the hot tier loses
// nothing that reached the SSD.
type Cache struct {
	Hot *Hot
	SSD *SSD
	// NoPromote keeps SSD hits out of the hot tier.
	NoPromote bool
}

// Stats is the snapshot of both tiers (ssd absent without an SSD tier).
type Stats struct {
	Hot HotStats  `json:"hot"`
	SSD *SSDStats `json:"ssd,omitempty"`
}

// New returns a cache over the given tiers; hot nil means a zero budget.
func New(hot *Hot, ssd *SSD) *Cache {
	if hot == nil {
		hot = NewHot(0)
	}
	return &Cache{Hot: hot, SSD: ssd}
}

// Save stores data under key in the hot tier and queues it for the SSD tier (see
// SSD.Save: it may write inline when the queue is full). data must not be modified
// afterwards.
func (c *Cache) Save(key Key, data []byte) error {
	c.Hot.Put(key, data)
	if c.SSD == nil {
		return nil
	}
	return c.SSD.Save(key, data)
}

// Longest finds the longest cached prefix among keys (as returned by BlockKeys for
// the new prompt): depth is the number of leading keys covered (0 when none), tier
// where the state came from. At equal depth the hot tier wins; an SSD state deeper
// than any hot one is read, verified and, unless NoPromote, put into the hot tier.
func (c *Cache) Longest(keys []Key) (depth int, data []byte, tier Tier) {
	hi, hdata := c.Hot.deepest(keys)
	if c.SSD != nil {
		if si, sdata := c.SSD.deepest(keys, hi+1); si >= 0 {
			c.SSD.count(true)
			c.Hot.count(false)
			if !c.NoPromote {
				c.Hot.Put(keys[si], sdata)
			}
			return si + 1, sdata, TierSSD
		}
	}
	if hi >= 0 {
		c.Hot.count(true)
		return hi + 1, hdata, TierHot
	}
	c.Hot.count(false)
	if c.SSD != nil {
		c.SSD.count(false)
	}
	return 0, nil, TierNone
}

// Forget removes keys from both tiers (see SSD.Forget).
func (c *Cache) Forget(keys ...Key) error {
	c.Hot.Remove(keys...)
	if c.SSD == nil {
		return nil
	}
	_, err := c.SSD.Forget(keys...)
	return err
}

// Stats returns both tiers' snapshots.
func (c *Cache) Stats() Stats {
	st := Stats{Hot: c.Hot.Stats()}
	if c.SSD != nil {
		s := c.SSD.Stats()
		st.SSD = &s
	}
	return st
}

// Close clears the hot tier and closes the SSD tier (see SSD.Close).
func (c *Cache) Close(ctx context.Context) error {
	c.Hot.Clear()
	if c.SSD == nil {
		return nil
	}
	return c.SSD.Close(ctx)
}
