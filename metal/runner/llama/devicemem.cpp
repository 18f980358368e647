//go:build cgo && !race

// The runner's own buffers on accelerators: what llama.cpp allocated for the model's
// weights and for each context's KV cache and compute graph, by buffer type. The
// device's own counters (ggml_backend_dev_memory) say what the whole card holds, every
// process together; these are this process's alone. Host buffers (the CPU's, and the
// pinned host memory a GPU backend offers) are not counted: the process's footprint
// already holds them.
#include "devicemem.h"

#include "llama-context.h"
#include "llama-model.h"

extern "C" uint64_t mf_model_device_bytes(const struct llama_model *model) {
	uint64_t n = 0;
	for (const auto &kv : model->memory_breakdown()) {
		if (!ggml_backend_buft_is_host(kv.first)) {
			n += kv.second;
		}
	}
	return n;
}

extern "C" uint64_t mf_context_device_bytes(const struct llama_context *ctx) {
	uint64_t n = 0;
	for (const auto &kv : ctx->memory_breakdown()) {
		if (!ggml_backend_buft_is_host(kv.first)) {
			n += kv.second.context + kv.second.compute;
		}
	}
	return n;
}
