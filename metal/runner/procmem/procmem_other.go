//go:build !linux && !(darwin && cgo)

package procmem

import "errors"

// Self is not implemented on this platform.
func Self() (int64, error) { return 0, errors.New("memory footprint is not measured on this platform") }
