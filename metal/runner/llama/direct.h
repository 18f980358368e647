#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// mf_sample_direct draws a token from softmax(logits / temp) over n logits, u being
// uniform in [0, 1) from the caller's seeded generator, or returns the first largest
// logit when temp <= 0. scratch holds n floats. It returns -1 without logits.
int32_t mf_sample_direct(const float *logits, int32_t n, float temp, double u, float *scratch);

// mf_argmax is the index of the first largest of n floats (a NaN is never the
// largest; 0 when nothing is larger than the first), -1 for none.
int32_t mf_argmax(const float *x, int32_t n);

#ifdef __cplusplus
}
#endif
