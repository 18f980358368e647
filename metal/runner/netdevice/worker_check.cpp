// The worker's checks of a graph's records (worker_check.h). Pure functions of a
// record: the worker applies them before ggml sees a byte of it (ggml_new_tensor
// itself asserts on a bad type or extent, which would end the worker).

#include "worker_check.h"

#include "ggml.h"

// The vendored ggml's numbering: the allowlist below names every op of this ggml, so
// a ggml with other ops fails the build here until it is reviewed.
static_assert(GGML_OP_COUNT == 95, "ggml's ops changed: review mfnd_op_sources's allowlist");
static_assert(GGML_TYPE_COUNT == 40, "ggml's types changed: review mfnd_check_record");

int mfnd_op_sources(int32_t op) {
	switch ((enum ggml_op)op) {
	// The ops of llama.cpp's text model graphs, with the sources each needs.
	case GGML_OP_NONE:
	case GGML_OP_ARANGE:
		return 0;
	case GGML_OP_DUP:
	case GGML_OP_SQR:
	case GGML_OP_SQRT:
	case GGML_OP_LOG:
	case GGML_OP_SIN:
	case GGML_OP_COS:
	case GGML_OP_SUM:
	case GGML_OP_SUM_ROWS:
	case GGML_OP_CUMSUM:
	case GGML_OP_MEAN:
	case GGML_OP_ARGMAX:
	case GGML_OP_NORM:
	case GGML_OP_RMS_NORM:
	case GGML_OP_GROUP_NORM:
	case GGML_OP_L2_NORM:
	case GGML_OP_SCALE:
	case GGML_OP_CONT:
	case GGML_OP_RESHAPE:
	case GGML_OP_VIEW:
	case GGML_OP_PERMUTE:
	case GGML_OP_TRANSPOSE:
	case GGML_OP_DIAG:
	case GGML_OP_DIAG_MASK_INF:
	case GGML_OP_DIAG_MASK_ZERO:
	case GGML_OP_SOFT_MAX:
	case GGML_OP_CLAMP:
	case GGML_OP_PAD:
	case GGML_OP_ROLL:
	case GGML_OP_ARGSORT:
	case GGML_OP_TOP_K:
	case GGML_OP_LEAKY_RELU:
	case GGML_OP_TRI:
	case GGML_OP_FILL:
	case GGML_OP_UNARY:
	case GGML_OP_GLU:
		return 1;
	case GGML_OP_ADD:
	case GGML_OP_ADD1:
	case GGML_OP_ACC:
	case GGML_OP_SUB:
	case GGML_OP_MUL:
	case GGML_OP_DIV:
	case GGML_OP_COUNT_EQUAL:
	case GGML_OP_REPEAT:
	case GGML_OP_CONCAT:
	case GGML_OP_MUL_MAT:
	case GGML_OP_SET:
	case GGML_OP_CPY:
	case GGML_OP_GET_ROWS:
	case GGML_OP_SET_ROWS:
	case GGML_OP_ROPE:
	case GGML_OP_SSM_CONV:
	case GGML_OP_SOLVE_TRI:
		return 2;
	case GGML_OP_ADD_ID:
	case GGML_OP_MUL_MAT_ID:
	case GGML_OP_FLASH_ATTN_EXT:
		return 3;
	case GGML_OP_GATED_LINEAR_ATTN:
		return 5;
	case GGML_OP_RWKV_WKV6:
		return 6;
	case GGML_OP_SSM_SCAN:
	case GGML_OP_RWKV_WKV7:
		return 7;
	default:
		// Not a text model's: the custom ops (a function pointer in the op params),
		// the training ops (backward passes, losses, optimizer steps), the vision and
		// audio encoders' convolutions and pools, and numbers ggml does not define.
		return -1;
	}
}

// defined says whether ggml defines type t (a number below the count may be one ggml
// has since removed: its block size is 0).
static bool defined(int32_t t) {
	return t >= 0 && t < GGML_TYPE_COUNT && ggml_blck_size((enum ggml_type)t) > 0 && ggml_type_size((enum ggml_type)t) > 0;
}

std::string mfnd_check_record(const mfnd_tensor &r, uint64_t *bytes) {
	if (!defined(r.type)) {
		return "tensor type " + std::to_string(r.type) + ", which ggml does not define";
	}
	if (mfnd_op_sources(r.op) < 0) {
		return "op " + std::to_string(r.op) + " (" + (r.op >= 0 && r.op < GGML_OP_COUNT ? ggml_op_name((enum ggml_op)r.op) : "unknown") +
		       "), not one of a llama graph's: custom ops, training ops and unknown numbers are refused";
	}
	if (r.op == GGML_OP_UNARY && (r.op_params[0] < 0 || r.op_params[0] >= GGML_UNARY_OP_COUNT)) {
		return "unary op " + std::to_string(r.op_params[0]) + ", which ggml does not define";
	}
	if (r.op == GGML_OP_GLU && (r.op_params[0] < 0 || r.op_params[0] >= GGML_GLU_OP_COUNT)) {
		return "gated linear unit op " + std::to_string(r.op_params[0]) + ", which ggml does not define";
	}
	enum ggml_type t = (enum ggml_type)r.type;
	uint64_t blck = (uint64_t)ggml_blck_size(t), tsize = ggml_type_size(t);
	uint64_t elements = 1, extent = 0;
	bool empty = false;
	for (int k = 0; k < GGML_MAX_DIMS; k++) {
		if (r.ne[k] < 0) {
			return "a negative extent " + std::to_string(r.ne[k]);
		}
		empty = empty || r.ne[k] == 0;
		if (__builtin_mul_overflow(elements, (uint64_t)r.ne[k], &elements) || elements > (uint64_t)INT64_MAX) {
			return "extents whose element count overflows";
		}
	}
	if (r.ne[0] % (int64_t)blck != 0) {
		return "a row of " + std::to_string(r.ne[0]) + " elements, not whole blocks of its type";
	}
	if (empty) {
		*bytes = 0;
		return "";
	}
	// ggml_nbytes: the first row's bytes, then (ne[k]-1) strides of each dimension.
	uint64_t first = tsize;
	if (blck != 1) {
		if (__builtin_mul_overflow((uint64_t)r.ne[0], r.nb[0], &first)) {
			return "a row whose bytes overflow";
		}
		first /= blck;
	}
	extent = first;
	for (int k = blck == 1 ? 0 : 1; k < GGML_MAX_DIMS; k++) {
		uint64_t span;
		if (__builtin_mul_overflow((uint64_t)(r.ne[k] - 1), r.nb[k], &span) || __builtin_add_overflow(extent, span, &extent)) {
			return "strides whose byte extent overflows";
		}
	}
	*bytes = extent;
	return "";
}
