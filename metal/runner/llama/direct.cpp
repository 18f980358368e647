//go:build cgo && !race

// Sampling straight from a row of logits, for the chains that are a temperature
// alone or greedy (no penalties, truncation or grammar): what a request that sets
// only `temperature` gets. llama.cpp's chain copies the row into candidate records,
// scales it in a pass of its own and, after the draw, normalises every probability;
// for a 32k vocabulary that was about 0.3 ms a token on an H100 host, 8% of a single
// stream's step. Here: one pass for the maximum, one of exp and sum, one cumulative
// pass that stops at the draw (about a third less time on the same row).

#include "direct.h"

#include <cmath>

// The largest of n > 0 floats (NaNs skipped, the first if nothing is larger), kept in
// lanes that do not wait for one another, which the compiler keeps in vector
// registers. A loop keeping the best index and comparing each float with the one at
// that index makes every step wait for the load the step before chose: 0.55 ms for a
// row of a 128k vocabulary on the 2-core machine (gcc -O2), where this and the pass
// for its index take 0.035 ms. A greedy step reads a row for each token it makes, and
// a verify step one for each drafted token (docs/speculative-decoding.md).
static float mf_max(const float *x, int32_t n) {
    constexpr int32_t lanes = 16;
    float m[lanes];
    for (int32_t k = 0; k < lanes; k++) {
        m[k] = x[0];
    }
    int32_t i = 0;
    for (; i + lanes <= n; i += lanes) {
        for (int32_t k = 0; k < lanes; k++) {
            m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
        }
    }
    float best = m[0];
    for (int32_t k = 1; k < lanes; k++) {
        best = m[k] > best ? m[k] : best;
    }
    for (; i < n; i++) {
        best = x[i] > best ? x[i] : best;
    }
    return best;
}

extern "C" int32_t mf_argmax(const float *x, int32_t n) {
    if (x == nullptr || n <= 0) {
        return -1;
    }
    const float best = mf_max(x, n);
    for (int32_t i = 0; i < n; i++) {
        if (x[i] == best) {
            return i;
        }
    }
    return 0; // every float NaN, or the first: nothing is larger than it
}

extern "C" int32_t mf_sample_direct(const float *logits, int32_t n, float temp, double u, float *scratch) {
    if (logits == nullptr || n <= 0) {
        return -1;
    }
    if (temp <= 0.0f) { // greedy: the first of the largest, as llama.cpp's greedy sampler
        return mf_argmax(logits, n);
    }
    const float max = mf_max(logits, n);
    const float inv = 1.0f / temp;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        scratch[i] = expf((logits[i] - max) * inv);
        sum += scratch[i];
    }
    const double target = u * sum;
    double run = 0;
    for (int32_t i = 0; i < n; i++) {
        run += scratch[i];
        if (run > target) {
            return i;
        }
    }
    // Rounding left the running sum a hair short of the target: the last token with
    // any weight.
    int32_t last = n - 1;
    while (last > 0 && scratch[last] == 0.0f) {
        last--;
    }
    return last;
}
