//go:build cgo && !race

// A draft model's greedy choice without its logits (docs/speculative-decoding.md,
// "The draft model's head"). A draft only ever needs the argmax of each row it
// proposes from, and a draft model sharing a target's vocabulary of 128k tokens spends
// most of a step on that vocabulary: on a CPU, ggml's one-row product calls its dot
// kernel once for each of the 128k rows (one block each for an embedding of 32), then
// the runner scans the 128k logits it wrote. Here the final norm's output is
// quantized as ggml quantizes the row for a q8_0 product, and one pass over the
// output matrix keeps the running best: no call a row, no row of logits.

#include "greedyhead.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ggml.h"
#include "gguf.h"

namespace {

constexpr int64_t block = 32;      // values in a q8_0 block
constexpr int64_t max_embd = 4096; // the largest embedding a head takes

struct q8_block {
    ggml_fp16_t d;
    int8_t qs[block];
};
static_assert(sizeof(q8_block) == 34, "q8_0 block layout");

} // namespace

struct mf_head {
    // int8_t rows: a row's values are contiguous, its blocks' scales apart.
    int8_t *qs = nullptr; // n_vocab rows of n_embd quantized values
    float *d = nullptr;   // n_vocab rows of n_embd/block scales
    int64_t n_embd = 0, n_vocab = 0;
};

extern "C" mf_head *mf_head_load(const char *path, int64_t n_embd, int64_t n_vocab, char *why, size_t why_len) {
    auto fail = [&](const char *msg) -> mf_head * {
        snprintf(why, why_len, "%s", msg);
        return nullptr;
    };
    if (n_embd <= 0 || n_embd % block != 0 || n_embd > max_embd || n_vocab <= 0) {
        return fail("the embedding is not a whole number of q8_0 blocks up to 4096");
    }
    gguf_init_params ip = {/*.no_alloc =*/true, /*.ctx =*/nullptr};
    gguf_context *g = gguf_init_from_file(path, ip);
    if (g == nullptr) {
        return fail("the file could not be read as a GGUF");
    }
    int64_t id = gguf_find_tensor(g, "output.weight");
    if (id < 0) {
        id = gguf_find_tensor(g, "token_embd.weight");
    }
    if (id < 0) {
        gguf_free(g);
        return fail("the file has no output matrix in this part");
    }
    if (gguf_get_tensor_type(g, id) != GGML_TYPE_Q8_0) {
        gguf_free(g);
        return fail("the output matrix is not q8_0");
    }
    const size_t want = size_t(n_vocab) * size_t(n_embd / block) * sizeof(q8_block);
    if (gguf_get_tensor_size(g, id) != want) {
        gguf_free(g);
        return fail("the output matrix is not the model's embedding by its vocabulary");
    }
    const size_t at = gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id);
    gguf_free(g);

    // Stored apart: the values as rows of int8, the scales as floats (an f16
    // conversion a block would otherwise be a call in the inner loop).
    auto *h = new mf_head;
    h->n_embd = n_embd;
    h->n_vocab = n_vocab;
    const int64_t nb = n_vocab * (n_embd / block);
    h->qs = static_cast<int8_t *>(malloc(size_t(n_vocab * n_embd)));
    h->d = static_cast<float *>(malloc(size_t(nb) * sizeof(float)));
    q8_block buf[256];
    FILE *f = fopen(path, "rb");
    bool ok = h->qs != nullptr && h->d != nullptr && f != nullptr && fseeko(f, off_t(at), SEEK_SET) == 0;
    for (int64_t i = 0; ok && i < nb;) {
        const int64_t n = nb - i < 256 ? nb - i : 256;
        ok = fread(buf, sizeof(q8_block), size_t(n), f) == size_t(n);
        for (int64_t j = 0; ok && j < n; j++, i++) {
            h->d[i] = ggml_fp16_to_fp32(buf[j].d);
            memcpy(h->qs + i * block, buf[j].qs, block);
        }
    }
    if (f != nullptr) {
        fclose(f);
    }
    if (!ok) {
        mf_head_free(h);
        return fail("the output matrix could not be read");
    }
    return h;
}

extern "C" void mf_head_free(mf_head *h) {
    if (h == nullptr) {
        return;
    }
    free(h->qs);
    free(h->d);
    delete h;
}

extern "C" int64_t mf_head_bytes(const mf_head *h) {
    return h == nullptr ? 0 : h->n_vocab * h->n_embd + h->n_vocab * (h->n_embd / block) * int64_t(sizeof(float));
}

namespace {

// quantize writes hidden (n_embd floats) as ggml's quantize_row_q8_0 would: a scale a
// block (rounded to f16, as the block stores it), each value rounded to the nearest
// of -127..127 steps. It returns the number of blocks.
int64_t quantize(const mf_head *h, const float *hidden, int8_t *q, float *dh) {
    const int64_t nb = h->n_embd / block;
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0;
        for (int64_t i = 0; i < block; i++) {
            amax = fmaxf(amax, fabsf(hidden[b * block + i]));
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dh[b] = ggml_fp16_to_fp32(ggml_fp32_to_fp16(d));
        for (int64_t i = 0; i < block; i++) {
            q[b * block + i] = int8_t(roundf(hidden[b * block + i] * id));
        }
    }
    return nb;
}

// Both kernels score a row as the sum over its blocks, in order, of the block's
// integer product times the two scales, so that they choose the same row.

// score is row r's product with the quantized hidden state (q, dh: nb blocks), in a
// loop the compiler keeps in vector registers (widened products summed).
inline float score(const mf_head *h, int64_t r, const int8_t *q, const float *dh, int64_t nb) {
    const int8_t *row = h->qs + r * h->n_embd;
    const float *d = h->d + r * nb;
    float s = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int64_t i = 0; i < block; i++) {
            sum += int16_t(row[b * block + i]) * int16_t(q[b * block + i]);
        }
        s += float(sum) * (d[b] * dh[b]);
    }
    return s;
}

// A pick is the best row of a range so far and its score.
struct pick {
    float best;
    int32_t arg;
};

// argmax_portable scores rows from..to in chunks, then scans each chunk for a better
// one than p.
pick argmax_portable(const mf_head *h, const int8_t *q, const float *dh, int64_t nb, int64_t from, int64_t to, pick p) {
    constexpr int64_t chunk = 64;
    float sc[chunk];
    float best = p.best;
    int32_t arg = p.arg;
    for (int64_t r0 = from; r0 < to; r0 += chunk) {
        const int64_t n = to - r0 < chunk ? to - r0 : chunk;
        for (int64_t r = 0; r < n; r++) {
            sc[r] = score(h, r0 + r, q, dh, nb);
        }
        for (int64_t r = 0; r < n; r++) {
            if (sc[r] > best) {
                best = sc[r];
                arg = int32_t(r0 + r);
            }
        }
    }
    return {best, arg};
}

#if defined(__AVX2__)
// argmax_avx2 scores rows from..to four at a time: each block's 32 products summed in
// pairs (unsigned by signed, the sign moved onto the row, as ggml's q8_0 product
// does), the four rows' sums gathered by horizontal adds; the last rows go the
// portable way.
pick argmax_avx2(const mf_head *h, const int8_t *q, const float *dh, int64_t nb, int64_t from, int64_t to) {
    const __m256i ones = _mm256_set1_epi16(1);
    float best = -INFINITY;
    int32_t arg = int32_t(from);
    int64_t r0 = from;
    for (; r0 + 4 <= to; r0 += 4) {
        float s[4] = {0, 0, 0, 0};
        for (int64_t b = 0; b < nb; b++) {
            const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + b * block));
            const __m256i aq = _mm256_sign_epi8(qv, qv);
            __m256i p[4];
            for (int r = 0; r < 4; r++) {
                const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h->qs + (r0 + r) * h->n_embd + b * block));
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(x, qv)), ones);
            }
            const __m256i s4 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            int32_t sum[4];
            _mm_storeu_si128(reinterpret_cast<__m128i *>(sum), t);
            for (int r = 0; r < 4; r++) {
                s[r] += float(sum[r]) * (h->d[(r0 + r) * nb + b] * dh[b]);
            }
        }
        for (int r = 0; r < 4; r++) {
            if (s[r] > best) {
                best = s[r];
                arg = int32_t(r0 + r);
            }
        }
    }
    return argmax_portable(h, q, dh, nb, r0, to, {best, arg}); // the last rows
}
#endif

// range_argmax is the best row of from..to (clamped to the vocabulary) and its score.
pick range_argmax(const mf_head *h, const float *hidden, int64_t from, int64_t to, bool portable) {
    int8_t q[max_embd];
    float dh[max_embd / block];
    const int64_t nb = quantize(h, hidden, q, dh);
    from = from < 0 ? 0 : from;
    to = to > h->n_vocab ? h->n_vocab : to;
#if defined(__AVX2__)
    if (!portable) {
        return argmax_avx2(h, q, dh, nb, from, to);
    }
#endif
    (void)portable;
    return argmax_portable(h, q, dh, nb, from, to, {-INFINITY, int32_t(from)});
}

} // namespace

extern "C" int32_t mf_head_argmax_with(const mf_head *h, const float *hidden, bool portable) {
    if (h == nullptr || hidden == nullptr) {
        return -1;
    }
    return range_argmax(h, hidden, 0, h->n_vocab, portable).arg;
}

extern "C" int32_t mf_head_argmax(const mf_head *h, const float *hidden) {
    return mf_head_argmax_with(h, hidden, false);
}

extern "C" int32_t mf_head_argmax_rows(const mf_head *h, const float *hidden, int64_t from, int64_t to, float *score) {
    if (h == nullptr || hidden == nullptr || from >= to) {
        return -1;
    }
    const pick p = range_argmax(h, hidden, from, to, false);
    *score = p.best;
    return p.arg;
}

extern "C" bool mf_stop_at_norm(struct ggml_tensor *t, bool ask, void *user) {
    auto *stop = static_cast<mf_stop *>(user);
    if (stop == nullptr || stop->on == 0) {
        return !ask; // nothing asked for: the graph runs whole
    }
    if (ask) {
        // The norm's output, named again by llama.cpp's pooling step when the context
        // has embeddings (it does: they are what the caller reads).
        return strcmp(t->name, "result_norm") == 0 || strcmp(t->name, "result_embd_pooled") == 0;
    }
    stop->stops++;
    return false; // the norm is computed: the rest of the graph is not
}
