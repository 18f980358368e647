package sandbox

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/macfleet/macfleet/internal/modelsource"
)

// OtherParts are the files a runner loads besides model when model is the first part
// of a model stored in parts (NAME-00001-of-0000N.gguf): parts 2 to N, named as the
// runner looks them up, beside the first. None for any other model, a later part
// included (the runner loads a model from its first part only). The store names each
// part by a link (agent/store, parts/<hash>/); a grant on a part is on the file its
// link resolves to, so nothing else in the links' directory or the store is granted.
func OtherParts(model string) []string {
	dir, name := filepath.Split(model)
	if !modelsource.IsSplitPart(name) {
		return nil
	}
	const suffix = len("-00001-of-00003.gguf")
	prefix := name[:len(name)-suffix]
	var no, count int
	if _, err := fmt.Sscanf(strings.ToLower(name[len(prefix):]), "-%05d-of-%05d.gguf", &no, &count); err != nil ||
		no != 1 || count < 2 || modelsource.PartName(prefix, no, count) != name {
		return nil
	}
	parts := make([]string, 0, count-1)
	for i := 2; i <= count; i++ {
		parts = append(parts, filepath.Join(dir, modelsource.PartName(prefix, i, count)))
	}
	return parts
}
