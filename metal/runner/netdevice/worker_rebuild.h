// What the worker checks of a graph's node once its tensors are built
// (worker_rebuild.cpp): each node is what ggml's own constructor for its op makes of
// its sources and op params, so that no kernel follows one tensor's shape into
// another's memory.
#pragma once

#include <string>

#include "ggml.h"

// mfnd_rebuild_check returns why node t may not be computed, "" when it may: it
// rebuilds t through the ggml_* constructor of its op from t's sources and op params
// and compares type, extents, strides and op params with t's (an in-place variant's
// strides are its first source's). A constructor's assertion on the sources (a shape
// it would refuse) is a refusal naming it, not the end of the worker. SET and ACC
// also need their view of the destination within it (the kernel adds a signed offset
// with wrapping arithmetic).
std::string mfnd_rebuild_check(struct ggml_tensor *t);

// mfnd_install_abort_hook makes ggml's assertions that fire inside
// mfnd_rebuild_check return to it; any other assertion still ends the process.
void mfnd_install_abort_hook();
