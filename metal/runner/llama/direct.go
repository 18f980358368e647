//go:build cgo && !race

package llama

/*
#include "direct.h"
*/
import "C"

import "unsafe"

// sampleDirect is mf_sample_direct over a Go row (for its tests).
func sampleDirect(row []float32, temp float32, u float64) int32 {
	scratch := make([]float32, len(row))
	return int32(C.mf_sample_direct((*C.float)(unsafe.Pointer(&row[0])), C.int32_t(len(row)), C.float(temp), C.double(u),
		(*C.float)(unsafe.Pointer(&scratch[0]))))
}

// argmax is mf_argmax over a Go row (for its tests).
func argmax(row []float32) int32 {
	if len(row) == 0 {
		return int32(C.mf_argmax(nil, 0))
	}
	return int32(C.mf_argmax((*C.float)(unsafe.Pointer(&row[0])), C.int32_t(len(row))))
}
