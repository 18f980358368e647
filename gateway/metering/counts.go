package metering

import (
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// MaxCount is the most any count of tokens or requests holds: sums saturate there
// (mfv1.MaxUsageCount, which the TokenUsage schema also states).
const MaxCount = mfv1.MaxUsageCount

// Count is n held within [0, MaxCount]: a count is never negative.
func Count(n int64) int64 { return min(max(n, 0), MaxCount) }

// AddCount is a + b for counts: each is first held within [0, MaxCount], and the sum
// saturates at MaxCount instead of wrapping.
func AddCount(a, b int64) int64 { return min(Count(a)+Count(b), MaxCount) }
