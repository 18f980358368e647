//go:build !linux

package promptcache

import "testing"

const canDropPageCache = false

func dropPageCache(*testing.B, string) {}
