package gateway

import "testing"

func wideInTest(a, b, c, d, e, f, g int) {}

func TestWide(t *testing.T) {}
