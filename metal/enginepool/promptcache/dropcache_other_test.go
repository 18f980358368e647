//go:build !linux

package promptcache

import "testing"

const canDropFileCache = false

func dropFileCache(*testing.B, string) {}
