package promptcache

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func hotKeys(h *Hot) []Key {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Key
	for e := h.lru.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*hotEntry).key)
	}
	return out
}

func TestHotLRU(t *testing.T) {
	h := NewHot(300)
	for i := range 3 {
		if !h.Put(key(i), payload(i, 100)) {
			t.Fatalf("Put %d refused", i)
		}
	}
	// Using key 0 makes key 1 the least recently used.
	if _, ok := h.Get(key(0)); !ok {
		t.Fatal("key 0 missing")
	}
	h.Put(key(3), payload(3, 100))
	if diff := cmp.Diff([]Key{key(3), key(0), key(2)}, hotKeys(h)); diff != "" {
		t.Errorf("LRU order (-want +got):\n%s", diff)
	}
	// Replacing a key does not double count it.
	h.Put(key(2), payload(2, 50))
	if got := h.Stats().Bytes; got != 250 {
		t.Errorf("bytes = %d after replacing, want 250", got)
	}
	// Too large for the budget: refused, and the older state under the key is gone.
	if h.Put(key(0), payload(0, 301)) {
		t.Error("a state larger than the budget was stored")
	}
	if _, ok := h.Get(key(0)); ok {
		t.Error("the replaced state of key 0 survived a refused Put")
	}
	want := HotStats{Entries: 2, Bytes: 150, BudgetBytes: 300, Hits: 1, Misses: 1, Puts: 6, Evictions: 1, Rejected: 1}
	if diff := cmp.Diff(want, h.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestHotSetBudgetShrinksAtOnce(t *testing.T) {
	tests := []struct {
		name       string
		budget     int64
		wantKeys   []Key
		wantBytes  int64
		wantEvicts int
	}{
		{"grow keeps all", 1000, []Key{key(3), key(2), key(1), key(0)}, 0, 0},
		{"shrink drops the least recently used", 250, []Key{key(3), key(2)}, 200, 2},
		{"zero empties", 0, nil, 400, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHot(400)
			for i := range 4 {
				h.Put(key(i), payload(i, 100))
			}
			b, n := h.SetBudget(tt.budget)
			if b != tt.wantBytes || n != tt.wantEvicts {
				t.Errorf("SetBudget = %d bytes, %d entries; want %d, %d", b, n, tt.wantBytes, tt.wantEvicts)
			}
			if diff := cmp.Diff(tt.wantKeys, hotKeys(h)); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
			if st := h.Stats(); st.Bytes > tt.budget || st.BudgetBytes != tt.budget {
				t.Errorf("stats %+v over budget %d", st, tt.budget)
			}
		})
	}
}

func TestHotClearAndRemove(t *testing.T) {
	h := NewHot(1000)
	for i := range 5 {
		h.Put(key(i), payload(i, 10*(i+1)))
	}
	if n := h.Remove(key(0), key(9)); n != 1 {
		t.Errorf("Remove = %d, want 1", n)
	}
	b, n := h.Clear()
	if b != 20+30+40+50 || n != 4 {
		t.Errorf("Clear = %d bytes, %d entries; want 140, 4", b, n)
	}
	if st := h.Stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Errorf("after Clear: %+v", st)
	}
	if _, ok := h.Get(key(4)); ok {
		t.Error("an entry survived Clear")
	}
}
