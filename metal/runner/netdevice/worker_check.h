// What the worker checks of a graph before it builds a tensor of it (worker_check.cpp):
// a worker computes only what a llama.cpp graph computes, within its own buffers.
#pragma once

#include <stdint.h>

#include <string>

#include "wire.h"

// mfnd_check_record returns why a graph record may not be built, "" when it may: a
// type ggml defines, an op of the allowlist (never a custom op, whose op params are a
// function the backend would call, nor a training op), the op params an op indexes a
// table with within it, non-negative extents whose element count and byte extent
// (*bytes: what ggml_nbytes gives, computed with checked arithmetic) do not overflow.
std::string mfnd_check_record(const mfnd_tensor &r, uint64_t *bytes);

// mfnd_op_sources is how many sources (src[0..n-1]) the op of a node needs.
int mfnd_op_sources(int32_t op);
