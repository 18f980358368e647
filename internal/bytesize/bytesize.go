// Package bytesize formats byte counts for people: binary units with one decimal
// (3.5 GiB), whole bytes below 1 KiB. The console, kubectl's memory columns and the
// agent's messages print memory this way.
package bytesize

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Format prints n in binary units with one decimal (3.5 GiB), bytes below 1 KiB.
func Format(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for (v >= unit || v <= -unit) && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[i])
}

// Quantity formats q like Format; "" when q is nil (unknown).
func Quantity(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	return Format(q.Value())
}
