// Package gateway has 2 functions with more than 6 parameters.
package gateway

func seven(a, b, c int, d string, e, f, g bool) {}

func six(a, b, c, d, e, f int) {}

// G is a receiver, which is not a parameter.
type G struct{}

func (g *G) six(a, b, c, d, e, f int) {}

func (g *G) seven(int, string, bool, int, int, int, func()) {}
