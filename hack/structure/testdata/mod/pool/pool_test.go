package pool

import "testing"

// A test file counts for nothing.
type testHolder struct{ p *Pool }

func (h testHolder) resetLocked() { h.p.mu.Lock(); h.p.mu.Unlock() }

func TestAcquire(t *testing.T) { _ = testHolder{} }
