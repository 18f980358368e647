// Package gatewayx is not under gateway/.
package gatewayx

func seven(a, b, c, d, e, f, g int) {}
