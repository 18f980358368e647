// Package sub is under gateway/: 1 function with more than 6 parameters.
package sub

func eight(a, b, c, d, e, f, g, h int) {}
