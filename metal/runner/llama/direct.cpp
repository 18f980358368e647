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

extern "C" int32_t mf_sample_direct(const float *logits, int32_t n, float temp, double u, float *scratch) {
    if (logits == nullptr || n <= 0) {
        return -1;
    }
    if (temp <= 0.0f) { // greedy: the first of the largest, as llama.cpp's greedy sampler
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        return best;
    }
    float max = logits[0];
    for (int32_t i = 1; i < n; i++) {
        max = logits[i] > max ? logits[i] : max;
    }
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
