package promptcache

import (
	"container/list"
	"sync"
)

// Hot is the in-memory tier: an LRU of states under a byte budget. The budget can be
// changed at any time (the agent moves shares between runners); a smaller budget
// evicts least recently used states at once. Stored slices are shared with callers
// and must not be modified.
type Hot struct {
	mu     sync.Mutex
	budget int64
	bytes  int64
	lru    list.List // of *hotEntry, front = most recently used
	index  map[Key]*list.Element

	hits, misses, puts, evictions, rejected int64
}

type hotEntry struct {
	key  Key
	data []byte
}

// HotStats is a snapshot of the hot tier.
type HotStats struct {
	Entries     int   `json:"entries"`
	Bytes       int64 `json:"bytes"`
	BudgetBytes int64 `json:"budgetBytes"`
	Hits        int64 `json:"hits"`
	Misses      int64 `json:"misses"`
	Puts        int64 `json:"puts"`
	Evictions   int64 `json:"evictions"`
	// Rejected counts states larger than the whole budget, never stored.
	Rejected int64 `json:"rejected"`
}

// NewHot returns an empty hot tier with the given budget (<= 0 stores nothing).
func NewHot(budgetBytes int64) *Hot {
	return &Hot{budget: max(budgetBytes, 0), index: map[Key]*list.Element{}}
}

// Put stores data under key as the most recently used entry, evicting LRU entries to
// stay under the budget. It reports false when data alone exceeds the budget (any
// older state under key is dropped then).
func (h *Hot) Put(key Key, data []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.puts++
	if e, ok := h.index[key]; ok {
		h.removeLocked(e)
	}
	if int64(len(data)) > h.budget {
		h.rejected++
		return false
	}
	h.index[key] = h.lru.PushFront(&hotEntry{key: key, data: data})
	h.bytes += int64(len(data))
	h.shrinkLocked()
	return true
}

// Get returns the state under key and marks it most recently used.
func (h *Hot) Get(key Key) ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	data, ok := h.getLocked(key)
	if ok {
		h.hits++
	} else {
		h.misses++
	}
	return data, ok
}

// Peek returns the state under key without marking it used or counting a hit or miss
// (a peer's export is not a lookup of this runner's).
func (h *Hot) Peek(key Key) ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.index[key]
	if !ok {
		return nil, false
	}
	return e.Value.(*hotEntry).data, true
}

// Has reports whether key is stored, without marking it used or counting a hit.
func (h *Hot) Has(key Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.index[key]
	return ok
}

func (h *Hot) getLocked(key Key) ([]byte, bool) {
	e, ok := h.index[key]
	if !ok {
		return nil, false
	}
	h.lru.MoveToFront(e)
	return e.Value.(*hotEntry).data, true
}

// deepest returns the index of the deepest key present (or -1) and its data, marking
// it used, without counting a hit or miss.
func (h *Hot) deepest(keys []Key) (int, []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(keys) - 1; i >= 0; i-- {
		if data, ok := h.getLocked(keys[i]); ok {
			return i, data
		}
	}
	return -1, nil
}

func (h *Hot) count(hit bool) {
	h.mu.Lock()
	if hit {
		h.hits++
	} else {
		h.misses++
	}
	h.mu.Unlock()
}

// Remove drops the given keys and returns how many were present.
func (h *Hot) Remove(keys ...Key) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, k := range keys {
		if e, ok := h.index[k]; ok {
			h.removeLocked(e)
			n++
		}
	}
	return n
}

// SetBudget changes the budget and evicts LRU entries at once until the tier fits; it
// returns what was evicted.
func (h *Hot) SetBudget(budgetBytes int64) (evictedBytes int64, evictedEntries int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.budget = max(budgetBytes, 0)
	before, n := h.bytes, h.lru.Len()
	h.shrinkLocked()
	return before - h.bytes, n - h.lru.Len()
}

// Clear drops every entry and returns the bytes and entries dropped.
func (h *Hot) Clear() (bytes int64, entries int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	bytes, entries = h.bytes, h.lru.Len()
	h.lru.Init()
	clear(h.index)
	h.bytes = 0
	return bytes, entries
}

// Stats returns a snapshot.
func (h *Hot) Stats() HotStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HotStats{
		Entries: h.lru.Len(), Bytes: h.bytes, BudgetBytes: h.budget,
		Hits: h.hits, Misses: h.misses, Puts: h.puts, Evictions: h.evictions, Rejected: h.rejected,
	}
}

func (h *Hot) shrinkLocked() {
	for h.bytes > h.budget {
		h.removeLocked(h.lru.Back())
		h.evictions++
	}
}

func (h *Hot) removeLocked(e *list.Element) {
	he := h.lru.Remove(e).(*hotEntry)
	delete(h.index, he.key)
	h.bytes -= int64(len(he.data))
}
