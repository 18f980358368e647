//go:build cgo && !race

// Grammar support for the runner: JSON schema to GBNF (llama.cpp's converter, compiled
// by the ollama module's common package) and sampling under a grammar. Every entry
// point catches C++ exceptions: one escaping into cgo would abort the runner.

#include "grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "json-schema-to-grammar.h"
#include "llama-grammar.h"

// The build description llama.cpp's common helpers print; the ollama module defines
// these in a package the runner does not link.
int LLAMA_BUILD_NUMBER = 0;
char const *LLAMA_COMMIT = "";
char const *LLAMA_COMPILER = "";
char const *LLAMA_BUILD_TARGET = "";

static char *mf_dup(const std::string &s) {
    char *out = static_cast<char *>(malloc(s.size() + 1));
    if (out != nullptr) {
        memcpy(out, s.c_str(), s.size() + 1);
    }
    return out;
}

static void mf_substitute(std::string &body, const std::string &from, const std::string &to) {
    for (size_t at = body.find(from); at != std::string::npos; at = body.find(from, at + to.size())) {
        body.replace(at, from.size(), to);
    }
}

extern "C" char *mf_build_grammar(const char *schemas, const char *rules, char **err) {
    *err = nullptr;
    try {
        auto values = nlohmann::ordered_json::parse(schemas);
        auto extra = nlohmann::ordered_json::parse(rules);
        std::string out = build_grammar([&](const common_grammar_builder &b) {
            std::vector<std::pair<std::string, std::string>> names;
            for (auto &[name, schema] : values.items()) {
                b.resolve_refs(schema);
                names.emplace_back("{{" + name + "}}", b.add_schema(name, schema));
            }
            for (auto &[name, body] : extra.items()) {
                std::string text = body.get<std::string>();
                for (const auto &[from, to] : names) {
                    mf_substitute(text, from, to);
                }
                b.add_rule(name, text);
            }
        });
        return mf_dup(out);
    } catch (const std::exception &e) {
        *err = mf_dup(e.what());
    } catch (...) {
        *err = mf_dup("unknown error");
    }
    return nullptr;
}

extern "C" struct llama_sampler *mf_grammar_init(const struct llama_model *model, const char *gbnf,
                                                 const char **triggers, int32_t n_triggers, char **err) {
    *err = nullptr;
    try {
        const struct llama_vocab *vocab = llama_model_get_vocab(model);
        struct llama_sampler *g =
            n_triggers > 0
                ? llama_sampler_init_grammar_lazy_patterns(vocab, gbnf, "root", triggers, (size_t)n_triggers, nullptr, 0)
                : llama_sampler_init_grammar(vocab, gbnf, "root");
        if (g == nullptr) {
            *err = mf_dup("the grammar does not parse");
        }
        return g;
    } catch (const std::exception &e) {
        *err = mf_dup(e.what());
    } catch (...) {
        *err = mf_dup("unknown error");
    }
    return nullptr;
}

// mf_grammar_state is the state of llama.cpp's grammar sampler (llama_sampler_grammar
// in its llama-sampling.cpp, which no header declares) at the module version go.mod
// pins: mf_grammar_advance reads the grammar from it. A version that changes it must
// change this too; TestContinueUnderGrammar fails if they differ.
struct mf_grammar_state {
    const struct llama_vocab *vocab;
    std::string grammar_str;
    std::string grammar_root;
    struct llama_grammar *grammar;
};

extern "C" int32_t mf_grammar_advance(const struct llama_model *model, struct llama_sampler *smpl, const char *text,
                                      char **err) {
    *err = nullptr;
    try {
        if (smpl == nullptr || strcmp(llama_sampler_name(smpl), "grammar") != 0) {
            *err = mf_dup("not a grammar sampler");
            return -1;
        }
        // The state's first field is the vocabulary the sampler was made for: read
        // alone first, it says whether the layout above is this build's before any
        // other field is trusted, and the grammar must name the same vocabulary.
        auto *state = static_cast<mf_grammar_state *>(smpl->ctx);
        const struct llama_vocab *vocab = llama_model_get_vocab(model);
        if (state == nullptr || state->vocab != vocab) {
            *err = mf_dup("the grammar sampler's state is not laid out as this runner was built to read it (or was made for another model)");
            return -1;
        }
        if (state->grammar == nullptr || state->grammar->vocab != vocab) {
            *err = mf_dup("the sampler has no grammar for this model");
            return -1;
        }
        llama_grammar &g = *state->grammar;
        if (g.awaiting_trigger) {
            return 1;
        }
        // Each character in turn: a stack set that empties names where the text left
        // the grammar.
        const std::string all(text);
        size_t at = 0;
        while (at < all.size()) {
            size_t len = 1;
            const unsigned char lead = static_cast<unsigned char>(all[at]);
            if (lead >= 0xF0) {
                len = 4;
            } else if (lead >= 0xE0) {
                len = 3;
            } else if (lead >= 0xC0) {
                len = 2;
            }
            len = std::min(len, all.size() - at);
            try {
                llama_grammar_accept_str(g, all.substr(at, len));
            } catch (const std::exception &) {
                *err = mf_dup("the grammar does not accept the answer at byte " + std::to_string(at) + " (" +
                              all.substr(at, std::min<size_t>(len + 16, all.size() - at)) + "…)");
                return -1;
            }
            at += len;
        }
        return 0;
    } catch (const std::exception &e) {
        *err = mf_dup(e.what());
    } catch (...) {
        *err = mf_dup("unknown error");
    }
    return -1;
}

static void mf_fill(llama_token_data *cur, const float *logits, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        cur[i].id = i;
        cur[i].logit = logits[i];
        cur[i].p = 0.0f;
    }
}

// The allowed second bytes of a sequence by its lead byte (utf8Ranges in utf8.go).
static const uint8_t mf_utf8_ranges[5][2] = {{0x80, 0xBF}, {0xA0, 0xBF}, {0x80, 0x9F}, {0x90, 0xBF}, {0x80, 0x8F}};

static bool mf_in_range(uint8_t b, int32_t rng) {
    return b >= mf_utf8_ranges[rng][0] && b <= mf_utf8_ranges[rng][1];
}

// mf_utf8_next mirrors utf8Next in utf8.go (tested there, exhaustively): whether a
// piece of class c starting with byte first may follow output in state (pending, rng),
// and the state after it. state packs pending in bits 0-1 and rng in bits 2-4.
static bool mf_utf8_next(uint16_t c, uint8_t first, int32_t state, int32_t *next) {
    const int32_t lead = c & 0x03, pending = state & 0x03, rng = (state >> 2) & 0x07;
    if (c & 0x20) {
        return false;
    }
    if (c & 0x10) {
        if (lead > pending || !mf_in_range(first, rng)) {
            return false;
        }
        *next = pending - lead;
        return true;
    }
    if (lead != pending || (lead > 0 && !mf_in_range(first, rng))) {
        return false;
    }
    *next = ((c & 0x0c) >> 2) | (((c >> 6) & 0x07) << 2);
    return true;
}

extern "C" llama_token mf_sample(struct llama_sampler *chain, struct llama_sampler *grammar,
                                 const uint16_t *utf8_class, const uint8_t *utf8_first, int32_t *utf8_state,
                                 const struct llama_vocab *vocab, const float *logits, llama_token_data *cur,
                                 int32_t n_vocab, llama_token chosen, int32_t *resampled) {
    try {
        if (logits == nullptr || chosen >= n_vocab) {
            return -1;
        }
        llama_token id = chosen;
        llama_token_data_array arr = {cur, (size_t)n_vocab, -1, false};
        if (id < 0) {
            mf_fill(cur, logits, n_vocab);
            llama_sampler_apply(chain, &arr);
            if (arr.selected < 0 || arr.selected >= (int64_t)arr.size) {
                return -1;
            }
            id = arr.data[arr.selected].id;
        }
        if (grammar != nullptr) {
            int32_t next = 0;
            // Fast path: the chain's choice is usually allowed; check it alone.
            llama_token_data one = {id, 1.0f, 0.0f};
            llama_token_data_array single = {&one, 1, -1, false};
            llama_sampler_apply(grammar, &single);
            if (std::isinf(one.logit) || !mf_utf8_next(utf8_class[id], utf8_first[id], *utf8_state, &next)) {
                // Rejected: mask the whole vocabulary with the grammar (and UTF-8
                // validity), then sample.
                *resampled = 1;
                mf_fill(cur, logits, n_vocab);
                arr = {cur, (size_t)n_vocab, -1, false};
                llama_sampler_apply(grammar, &arr);
                for (size_t i = 0; i < arr.size; i++) {
                    int32_t ignored = 0;
                    const llama_token t = arr.data[i].id;
                    if (!mf_utf8_next(utf8_class[t], utf8_first[t], *utf8_state, &ignored)) {
                        arr.data[i].logit = -INFINITY;
                    }
                }
                llama_sampler_apply(chain, &arr);
                if (arr.selected < 0 || arr.selected >= (int64_t)arr.size || std::isinf(arr.data[arr.selected].logit)) {
                    return -2; // nothing the grammar allows
                }
                id = arr.data[arr.selected].id;
                mf_utf8_next(utf8_class[id], utf8_first[id], *utf8_state, &next);
            }
            *utf8_state = next;
            if (!llama_vocab_is_eog(vocab, id)) {
                llama_sampler_accept(grammar, id);
            }
        }
        llama_sampler_accept(chain, id);
        return id;
    } catch (...) {
        return -2;
    }
}

extern "C" float mf_logprobs(struct llama_context *ctx, int32_t idx, int32_t n_vocab, llama_token chosen,
                             int32_t k, llama_token *top_ids, float *top_lps) {
    const float *logits = llama_get_logits_ith(ctx, idx);
    if (logits == nullptr) {
        return NAN;
    }
    float mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (logits[i] > mx) {
            mx = logits[i];
        }
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        sum += std::exp((double)(logits[i] - mx));
    }
    const float lse = mx + (float)std::log(sum);
    // top k by insertion into a sorted array of at most k (k <= 20).
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {
        float l = logits[i];
        if (n == k && l <= top_lps[n - 1]) {
            continue;
        }
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && top_lps[j - 1] < l) {
            top_lps[j] = top_lps[j - 1];
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_lps[j] = l;
        top_ids[j] = i;
    }
    for (int32_t i = 0; i < n; i++) {
        top_lps[i] -= lse;
    }
    return logits[chosen] - lse;
}
