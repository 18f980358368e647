#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

// A greedy head: a model's next token taken straight from its final hidden state,
// the dot with every row of its q8_0 output matrix and their argmax fused in one
// pass, where llama.cpp would write a whole row of logits first (greedyhead.cpp).
typedef struct mf_head mf_head;

// mf_head_load reads the output matrix (output.weight, else the tied
// token_embd.weight) of the GGUF at path, which must be q8_0 of n_embd x n_vocab. On
// failure it returns NULL and writes why into why (why_len bytes).
mf_head *mf_head_load(const char *path, int64_t n_embd, int64_t n_vocab, char *why, size_t why_len);

void mf_head_free(mf_head *h);

// mf_head_bytes is the memory the head holds: its copy of the output matrix.
int64_t mf_head_bytes(const mf_head *h);

// mf_head_argmax is the row of the output matrix with the largest dot product with
// hidden (n_embd floats), quantized as ggml quantizes a row for a q8_0 product; the
// first among equals.
int32_t mf_head_argmax(const mf_head *h, const float *hidden);

// mf_head_argmax_rows is mf_head_argmax over the rows from..to only, writing the
// chosen row's score into score: a vocabulary split in ranges, each scanned by
// another thread, gives mf_head_argmax's row as the best of the ranges' (the first
// among equals). -1 for an empty range.
int32_t mf_head_argmax_rows(const mf_head *h, const float *hidden, int64_t from, int64_t to, float *score);

// mf_head_argmax_with is mf_head_argmax by the portable kernel where portable is set
// (what a machine without the vector kernel runs; the tests compare the two).
int32_t mf_head_argmax_with(const mf_head *h, const float *hidden, bool portable);

// mf_stop is mf_stop_at_norm's switch and count.
typedef struct mf_stop {
    int on;        // nonzero: stop each graph at the final norm
    int64_t stops; // graphs stopped so far
} mf_stop;

// mf_stop_at_norm is a context's graph callback (cb_eval; user is an mf_stop) that,
// while on, ends each graph once the final norm is computed, so that the output
// projection is never run: the rows' hidden states are read with
// llama_get_embeddings_ith and their logits are not computed.
bool mf_stop_at_norm(struct ggml_tensor *t, bool ask, void *user);

#ifdef __cplusplus
}
#endif
