#pragma once
#include <stdint.h>
#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// mf_model_device_bytes is the size of the model's weight buffers on accelerators.
uint64_t mf_model_device_bytes(const struct llama_model *model);
// mf_context_device_bytes is the size of a context's KV cache and compute buffers on
// accelerators (not the model's weights, which every context of a model shares).
uint64_t mf_context_device_bytes(const struct llama_context *ctx);

#ifdef __cplusplus
}
#endif
