#pragma once

#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// mf_build_grammar builds a GBNF grammar from schemas, a JSON object of named JSON
// schemas, and rules, a JSON object of named GBNF rule bodies (one named root) in
// which {{name}} stands for the rule of the schema of that name. On failure it
// returns NULL and sets *err. Both strings are malloc'd.
char *mf_build_grammar(const char *schemas, const char *rules, char **err);

// mf_grammar_init parses a GBNF grammar for the model's vocabulary. With n_triggers
// patterns it is lazy: it allows every token until the output so far matches one of
// them (ECMAScript, the whole output), then holds from the pattern's first group on.
struct llama_sampler *mf_grammar_init(const struct llama_model *model, const char *gbnf, const char **triggers,
                                      int32_t n_triggers, char **err);

// mf_grammar_advance moves a grammar sampler (from mf_grammar_init) past text, an
// output already written under it (a continued answer), so that what it allows next
// is what may follow that text. It returns 0, or -1 with *err set when the grammar
// does not accept the text, and 1 (nothing done) for a lazy grammar still waiting for
// its trigger: such a grammar watches only the output it sees. model is the one the
// sampler was made for: a sampler of another, or a state this build cannot read, is
// an error, not a read of memory it does not know.
int32_t mf_grammar_advance(const struct llama_model *model, struct llama_sampler *grammar, const char *text, char **err);

// mf_sample samples one row of logits (n_vocab floats of the last decode) with the
// chain, under grammar when it is not NULL, and accepts the token in both. cur holds
// n_vocab entries of scratch space, kept by the caller between calls. It touches no
// context: calls with distinct chains, grammars and scratch may run at once.
// chosen, when not negative, is the chain's own choice already drawn from the row (a
// chain sampled straight from the logits, direct.h), which the grammar then checks.
// It returns -1 when there are no logits and -2 when the grammar allows nothing.
// Under a grammar the output also stays valid UTF-8: utf8_class and utf8_first have
// each token's class (see utf8.go) and first byte, *utf8_state what the output needs.
llama_token mf_sample(struct llama_sampler *chain, struct llama_sampler *grammar, const uint16_t *utf8_class,
                      const uint8_t *utf8_first, int32_t *utf8_state, const struct llama_vocab *vocab,
                      const float *logits, llama_token_data *cur, int32_t n_vocab, llama_token chosen,
                      int32_t *resampled);

// mf_logprobs returns the log-probability of chosen in row idx and writes the k most
// likely tokens with theirs (k <= 20), most likely first.
float mf_logprobs(struct llama_context *ctx, int32_t idx, int32_t n_vocab, llama_token chosen, int32_t k,
                  llama_token *top_ids, float *top_lps);

#ifdef __cplusplus
}
#endif
