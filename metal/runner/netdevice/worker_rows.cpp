// The worker's check of the row indices a graph's GET_ROWS and SET_ROWS nodes read
// (worker.h, check_rows). ggml's CPU kernels assert each index (an abort of the
// worker before the access); a GPU's (Metal) reads and writes where the index points.
// Indices the graph does not compute (the runner sent them: token ids, the KV cache
// cells to write, the rows to output) are checked against their table's rows before
// the graph runs; indices a node of the same graph computes (a mixture of experts'
// choice) cannot be, and are left to the kernel.

#include <string.h>

#include <unordered_set>

#include "worker.h"

// rows_table is the tensor node's indices index the rows of, and those indices.
static void rows_of(const struct ggml_tensor *t, const struct ggml_tensor **table, const struct ggml_tensor **idx) {
	*table = *idx = NULL;
	if (t->op == GGML_OP_GET_ROWS) {
		*table = t->src[0];
		*idx = t->src[1];
	} else if (t->op == GGML_OP_SET_ROWS) {
		*table = t; // the node is its destination's view
		*idx = t->src[1];
	}
}

// out_of_range returns the first index of idx (I32 or I64, contiguous, as
// ggml_get_rows and ggml_set_rows require) outside [0, rows), or -1 when none is.
static int64_t out_of_range(const std::vector<uint8_t> &bytes, enum ggml_type type, int64_t rows, int64_t *value) {
	size_t size = type == GGML_TYPE_I64 ? 8 : 4;
	for (size_t i = 0; i + size <= bytes.size(); i += size) {
		int64_t v = 0;
		if (size == 8) {
			memcpy(&v, &bytes[i], 8);
		} else {
			int32_t v32;
			memcpy(&v32, &bytes[i], 4);
			v = v32;
		}
		if (v < 0 || v >= rows) {
			*value = v;
			return (int64_t)(i / size);
		}
	}
	return -1;
}

bool nd_worker::check_rows(const graph &gr, const std::vector<ggml_tensor *> &ts) {
	std::unordered_set<const ggml_tensor *> computed;
	for (uint32_t n : gr.nodes) {
		computed.insert(ts[n]);
	}
	std::vector<uint8_t> bytes;
	for (uint32_t n : gr.nodes) {
		const struct ggml_tensor *table, *idx;
		rows_of(ts[n], &table, &idx);
		if (idx == NULL || idx->buffer == NULL || computed.count(idx) > 0 || computed.count(idx->view_src) > 0 ||
		    !ggml_is_contiguous(idx) || (idx->type != GGML_TYPE_I32 && idx->type != GGML_TYPE_I64)) {
			continue; // computed here (left to the kernel), or refused by the rebuild already
		}
		bytes.resize(ggml_nbytes(idx));
		mfnd_range_get(idx->buffer, (uint64_t)(uintptr_t)idx->data, bytes.data(), bytes.size());
		int64_t v = 0, at = out_of_range(bytes, idx->type, table->ne[1], &v);
		if (at >= 0) {
			fail(std::string("graph node ") + std::to_string(n) + " (" + ggml_op_desc(ts[n]) + "): row index " + std::to_string(at) +
			     " is " + std::to_string(v) + ", outside the " + std::to_string(table->ne[1]) + " rows it indexes");
			return false;
		}
	}
	return true;
}
