// Package promptcache stores the serialized sequence (KV) state of a runner's slots so
// a later request whose prompt extends an earlier one restores the state and prefills
// only the new tokens.
//
// States are keyed by block-aligned token-prefix hashes (BlockKeys): key i is a chained
// hash of the model/format identity and the first (i+1)×blockSize tokens, so a prompt
// that extends a saved one shares the saved one's keys, and two models or two state
// formats never share a key.
//
// Two tiers hold them:
//   - Hot: an in-memory LRU under a byte budget that can be changed at runtime.
//   - SSD: one directory per model/format under a cache directory, a byte quota
//     bounded by the free disk, a bounded write queue drained by one writer
//     goroutine, inline eviction, checksummed files, and an index rebuilt from the
//     files on Open and kept in step with the directory, which several processes of
//     one identity may share (ssd_shared.go).
//
// Cache puts the two together: Save writes through to both, Longest finds the longest
// cached prefix (hot first, then SSD) and promotes SSD hits to hot.
//
// The package is pure Go with no Kubernetes imports; time and free disk are injected.
package promptcache
