package ggufsynth

import (
	"math"

	"github.com/x448/float16"
)

func (d DType) quantized() bool { return d == Q8_0 || d == Q4_0 }

// Quantized blocks as ggml lays them out: Q8_0 is an f16 scale, then 32 int8 values;
// Q4_0 an f16 scale, then 16 bytes: value j in the low nibble of byte j, value j+16
// in its high nibble, each offset by 8.

func appendScale(buf []byte, d float32) []byte {
	b := float16.Fromfloat32(d).Bits()
	return append(buf, byte(b), byte(b>>8))
}

// appendQ8_0: scale max|x|/127, values rounded to the nearest step.
func appendQ8_0(buf []byte, x *[blockSize]float32) []byte {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	buf = appendScale(buf, d)
	for _, v := range x {
		q := 0.0
		if d != 0 {
			q = math.Round(float64(v / d))
		}
		buf = append(buf, byte(int8(q)))
	}
	return buf
}

// appendQ4_0: the value of largest magnitude maps to -8, so the scale is it over
// -8; the others round to the nearest of the 16 steps, clamped.
func appendQ4_0(buf []byte, x *[blockSize]float32) []byte {
	var amax, mx float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, mx = a, v
		}
	}
	d := mx / -8
	buf = appendScale(buf, d)
	if d == 0 {
		for range blockSize / 2 {
			buf = append(buf, 8|8<<4)
		}
		return buf
	}
	var q [blockSize]byte
	for j, v := range x {
		q[j] = byte(min(15, max(0, int(math.Floor(float64(v/d)+8.5)))))
	}
	for j := range blockSize / 2 {
		buf = append(buf, q[j]|q[j+blockSize/2]<<4)
	}
	return buf
}
