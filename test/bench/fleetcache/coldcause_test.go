package main

import (
	"testing"
	"time"
)

func TestSplitCold(t *testing.T) {
	s := time.Second
	outs := []outcome{
		// tenant 0's first request: cold, its first token at 5 s.
		{Tenant: 0, Start: 0, TTFT: 5 * s, Prompt: 100},
		// arrives at 2 s, while tenant 0's first prefill runs: cold and early.
		{Tenant: 0, Start: 2 * s, TTFT: 9 * s, Prompt: 100, Cached: 10},
		// arrives after tenant 0's first token, restores: not cold.
		{Tenant: 0, Start: 6 * s, TTFT: s / 10, Prompt: 100, Cached: 90},
		// arrives after it but prefills anyway (evicted, other replica): late.
		{Tenant: 0, Start: 7 * s, TTFT: 4 * s, Prompt: 100},
		// tenant 1's first token at 3 s comes from its second request (the first is slow).
		{Tenant: 1, Start: 1 * s, TTFT: 8 * s, Prompt: 100},
		{Tenant: 1, Start: 2 * s, TTFT: 1 * s, Prompt: 100},
		{Tenant: 1, Start: 4 * s, Err: "timeout"},
	}
	got := splitCold(outs, 8*s)
	want := coldCauses{Cold: 5, Early: 4, Late: 1, Tail: 2, InTail: 2}
	if got != want {
		t.Errorf("splitCold = %+v, want %+v", got, want)
	}
	if got := splitCold(nil, 0); got != (coldCauses{}) {
		t.Errorf("splitCold(nil) = %+v", got)
	}
}
