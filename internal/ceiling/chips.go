package ceiling

import (
	"regexp"
	"strconv"
	"strings"
)

const gib = int64(1) << 30

// chipMemoryGiB is the largest unified memory, in GiB, that any Mac with each Apple
// Silicon chip has been sold with (generation → variant → GiB; "" is the base chip).
var chipMemoryGiB = map[int]map[string]int64{
	1: {"": 16, "pro": 32, "max": 64, "ultra": 128},
	2: {"": 24, "pro": 32, "max": 96, "ultra": 192},
	3: {"": 24, "pro": 36, "max": 128, "ultra": 512},
	4: {"": 32, "pro": 64, "max": 128},
	5: {"": 32},
}

// MaxAppleSiliconMemory is the most unified memory any Mac in the table has: the
// bound of a chip the table does not know.
var MaxAppleSiliconMemory = func() int64 {
	var m int64
	for _, variants := range chipMemoryGiB {
		for _, g := range variants {
			m = max(m, g*gib)
		}
	}
	return m
}()

// chipName finds "Apple M<generation>[ Pro| Max| Ultra]" in what the agent reports,
// e.g. "Apple M2 Max" or "Apple M4 (simulated)".
var chipName = regexp.MustCompile(`(?i)\bApple\s+M([0-9]{1,2})(?:\s+(Pro|Max|Ultra))?\b`)

// ChipMemory is the largest unified memory of any configuration of chip, as the
// agent reports it in status.hardware.chip. A chip the table does not know (a newer
// one, a variant not sold yet, a name that is not Apple Silicon, or none) is bounded
// by MaxAppleSiliconMemory and known is false: the reported chip is the Mac's own
// claim too, so an unknown one must not lift the bound, and an operator bounds such a
// Mac exactly with spec.memoryCeiling.
func ChipMemory(chip string) (bytes int64, known bool) {
	m := chipName.FindStringSubmatch(chip)
	if m == nil {
		return MaxAppleSiliconMemory, false
	}
	gen, err := strconv.Atoi(m[1])
	if err != nil {
		return MaxAppleSiliconMemory, false
	}
	g, ok := chipMemoryGiB[gen][strings.ToLower(m[2])]
	if !ok {
		return MaxAppleSiliconMemory, false
	}
	return g * gib, true
}
