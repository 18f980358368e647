package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// coldCauses splits a mode's cold answers (those that prefilled most of their prompt:
// restored less than half of it) by when they arrived against their tenant's first
// prefill: Early arrived before any request of their tenant had its first token (no
// replica had finished prefilling the prefix, so none could have saved or reported
// it), Late after. InTail counts the early ones among the answers at or above the
// TTFT p90.
type coldCauses struct {
	Cold, Early, Late, Tail, InTail int
}

// splitCold computes coldCauses of outs (failed answers are left out) with p90 the
// mode's TTFT p90.
func splitCold(outs []outcome, p90 time.Duration) coldCauses {
	firstToken := map[int]time.Duration{}
	for _, o := range outs {
		if o.Err != "" {
			continue
		}
		at := o.Start + o.TTFT
		if t, ok := firstToken[o.Tenant]; !ok || at < t {
			firstToken[o.Tenant] = at
		}
	}
	var c coldCauses
	for _, o := range outs {
		if o.Err != "" {
			continue
		}
		tail := p90 > 0 && o.TTFT >= p90
		if tail {
			c.Tail++
		}
		if 2*o.Cached >= o.Prompt {
			continue
		}
		c.Cold++
		if o.Start < firstToken[o.Tenant] {
			c.Early++
			if tail {
				c.InTail++
			}
		} else {
			c.Late++
		}
	}
	return c
}

// requestLines renders each answer of a mode (-requests): tenant, user, arrival,
// TTFT, prompt and restored tokens, and whether it arrived before its tenant's first
// token anywhere.
func requestLines(mode string, outs []outcome) string {
	first := map[int]time.Duration{}
	for _, o := range outs {
		if t, ok := first[o.Tenant]; o.Err == "" && (!ok || o.Start+o.TTFT < t) {
			first[o.Tenant] = o.Start + o.TTFT
		}
	}
	var b strings.Builder
	for _, o := range outs {
		ft, ok := first[o.Tenant]
		if !ok {
			ft = math.MaxInt64
		}
		fmt.Fprintf(&b, "  %s tenant %d user %2d: at %6.1f s, TTFT %6.2f s, restored %5d of %5d, before the tenant's first token: %v%s\n",
			mode, o.Tenant, o.User, o.Start.Seconds(), o.TTFT.Seconds(), o.Cached, o.Prompt, o.Start < ft, errText(o.Err))
	}
	return b.String()
}

func errText(e string) string {
	if e == "" {
		return ""
	}
	return ", failed: " + e
}
