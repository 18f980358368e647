// The worker's check of each node against ggml's own constructor for its op
// (worker_rebuild.h). The worker builds nodes from the wire as they are, and ggml's
// CPU kernels trust the shapes their constructors made: GET_ROWS writes as many rows
// as its indices have, whatever its own extents; SET_ROWS writes its destination's
// rows; SET adds a signed offset. Rebuilding each node from its sources and op params
// and comparing refuses any node a runner's ggml could not have made.

#include "worker_rebuild.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

// The assertion hook: while a thread checks a node, an assertion of ggml's on it
// returns to the check (the constructors are C and only touch the check's own
// context, so jumping out of them leaks nothing but that context, freed after).
static thread_local jmp_buf *g_check_jmp = NULL;
static thread_local char g_check_msg[512];
static ggml_abort_callback_t g_prev_abort = NULL;

static void on_abort(const char *message) {
	if (g_check_jmp == NULL) {
		if (g_prev_abort != NULL) {
			g_prev_abort(message);
		} else {
			fprintf(stderr, "%s\n", message);
		}
		return; // ggml_abort ends the process
	}
	snprintf(g_check_msg, sizeof(g_check_msg), "%s", message);
	longjmp(*g_check_jmp, 1);
}

void mfnd_install_abort_hook() {
	static bool installed = false;
	if (!installed) {
		installed = true;
		g_prev_abort = ggml_set_abort_callback(on_abort);
	}
}

static float f32(const struct ggml_tensor *t, int i) {
	float f;
	memcpy(&f, &t->op_params[i], sizeof(f));
	return f;
}

static void set_f32(struct ggml_tensor *t, int i, float f) {
	memcpy(&t->op_params[i], &f, sizeof(f));
}

// rebuild_one builds the ops of one source whose only parameters are op params.
static struct ggml_tensor *rebuild_one(struct ggml_context *c, const struct ggml_tensor *t) {
	struct ggml_tensor *a = t->src[0];
	const int32_t *p = t->op_params;
	switch (t->op) {
	case GGML_OP_DUP: return ggml_dup(c, a);
	case GGML_OP_SQR: return ggml_sqr(c, a);
	case GGML_OP_SQRT: return ggml_sqrt(c, a);
	case GGML_OP_LOG: return ggml_log(c, a);
	case GGML_OP_SIN: return ggml_sin(c, a);
	case GGML_OP_COS: return ggml_cos(c, a);
	case GGML_OP_SUM: return ggml_sum(c, a);
	case GGML_OP_SUM_ROWS: return ggml_sum_rows(c, a);
	case GGML_OP_CUMSUM: return ggml_cumsum(c, a);
	case GGML_OP_MEAN: return ggml_mean(c, a);
	case GGML_OP_ARGMAX: return ggml_argmax(c, a);
	case GGML_OP_NORM: return ggml_norm(c, a, f32(t, 0));
	case GGML_OP_RMS_NORM: return ggml_rms_norm(c, a, f32(t, 0));
	case GGML_OP_GROUP_NORM: return ggml_group_norm(c, a, p[0], f32(t, 1));
	case GGML_OP_L2_NORM: return ggml_l2_norm(c, a, f32(t, 0));
	case GGML_OP_SCALE: return ggml_scale_bias(c, a, f32(t, 0), f32(t, 1));
	case GGML_OP_CONT: return ggml_cont_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
	case GGML_OP_RESHAPE: return ggml_reshape_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
	case GGML_OP_PERMUTE: return ggml_permute(c, a, p[0], p[1], p[2], p[3]);
	case GGML_OP_TRANSPOSE: return ggml_transpose(c, a);
	case GGML_OP_DIAG: return ggml_diag(c, a);
	case GGML_OP_DIAG_MASK_INF: return ggml_diag_mask_inf(c, a, p[0]);
	case GGML_OP_DIAG_MASK_ZERO: return ggml_diag_mask_zero(c, a, p[0]);
	case GGML_OP_CLAMP: return ggml_clamp(c, a, f32(t, 0), f32(t, 1));
	case GGML_OP_ROLL: return ggml_roll(c, a, p[0], p[1], p[2], p[3]);
	case GGML_OP_ARGSORT: return ggml_argsort(c, a, (enum ggml_sort_order)p[0]);
	case GGML_OP_TOP_K: return ggml_top_k(c, a, (int)t->ne[0]);
	case GGML_OP_LEAKY_RELU: return ggml_leaky_relu(c, a, f32(t, 0), false);
	case GGML_OP_TRI: return ggml_tri(c, a, (enum ggml_tri_type)p[0]);
	case GGML_OP_FILL: return ggml_fill(c, a, f32(t, 0));
	case GGML_OP_UNARY: return ggml_unary(c, a, (enum ggml_unary_op)p[0]);
	case GGML_OP_REPEAT: return ggml_repeat_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
	case GGML_OP_VIEW: {
		size_t offs;
		memcpy(&offs, p, sizeof(offs));
		return ggml_view_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[1], t->nb[2], t->nb[3], offs);
	}
	case GGML_OP_PAD:
		return (p[8] != 0 ? ggml_pad_ext_circular : ggml_pad_ext)(c, a, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
	default: return NULL;
	}
}

// rebuild_more builds the ops of several sources (and the few of none).
static struct ggml_tensor *rebuild_more(struct ggml_context *c, struct ggml_tensor *t) {
	struct ggml_tensor *const *s = t->src;
	const int32_t *p = t->op_params;
	struct ggml_tensor *r = NULL;
	switch (t->op) {
	case GGML_OP_ADD: return ggml_add(c, s[0], s[1]);
	case GGML_OP_ADD1: return ggml_add1(c, s[0], s[1]);
	case GGML_OP_SUB: return ggml_sub(c, s[0], s[1]);
	case GGML_OP_MUL: return ggml_mul(c, s[0], s[1]);
	case GGML_OP_DIV: return ggml_div(c, s[0], s[1]);
	case GGML_OP_COUNT_EQUAL: return ggml_count_equal(c, s[0], s[1]);
	case GGML_OP_CONCAT: return ggml_concat(c, s[0], s[1], p[0]);
	case GGML_OP_CPY: return ggml_cpy(c, s[0], s[1]);
	case GGML_OP_GET_ROWS: return ggml_get_rows(c, s[0], s[1]);
	// SET_ROWS's destination is its src[2] (the node is a view of it), or the node.
	case GGML_OP_SET_ROWS: return ggml_set_rows(c, s[2] != NULL ? s[2] : t, s[0], s[1]);
	case GGML_OP_SSM_CONV: return ggml_ssm_conv(c, s[0], s[1]);
	case GGML_OP_SOLVE_TRI: return ggml_solve_tri(c, s[0], s[1], true, true, false);
	case GGML_OP_ADD_ID: return ggml_add_id(c, s[0], s[1], s[2]);
	case GGML_OP_MUL_MAT_ID: return ggml_mul_mat_id(c, s[0], s[1], s[2]);
	case GGML_OP_ARANGE: return ggml_arange(c, f32(t, 0), f32(t, 1), f32(t, 2));
	case GGML_OP_GATED_LINEAR_ATTN: return ggml_gated_linear_attn(c, s[0], s[1], s[2], s[3], s[4], f32(t, 0));
	case GGML_OP_RWKV_WKV6: return ggml_rwkv_wkv6(c, s[0], s[1], s[2], s[3], s[4], s[5]);
	case GGML_OP_SSM_SCAN: return ggml_ssm_scan(c, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
	case GGML_OP_RWKV_WKV7: return ggml_rwkv_wkv7(c, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
	case GGML_OP_SET:
	case GGML_OP_ACC: {
		auto f = t->op == GGML_OP_SET ? (p[4] ? ggml_set_inplace : ggml_set) : (p[4] ? ggml_acc_inplace : ggml_acc);
		return f(c, s[0], s[1], (size_t)p[0], (size_t)p[1], (size_t)p[2], (size_t)p[3]);
	}
	case GGML_OP_MUL_MAT:
		r = ggml_mul_mat(c, s[0], s[1]);
		ggml_mul_mat_set_prec(r, (enum ggml_prec)p[0]);
		return r;
	case GGML_OP_SOFT_MAX:
		r = ggml_soft_max_ext(c, s[0], s[1], f32(t, 0), f32(t, 1));
		if (s[2] != NULL) {
			ggml_soft_max_add_sinks(r, s[2]);
		}
		return r;
	case GGML_OP_FLASH_ATTN_EXT:
		r = ggml_flash_attn_ext(c, s[0], s[1], s[2], s[3], f32(t, 0), f32(t, 1), f32(t, 2));
		ggml_flash_attn_ext_set_prec(r, (enum ggml_prec)p[3]);
		if (s[4] != NULL) {
			ggml_flash_attn_ext_add_sinks(r, s[4]);
		}
		return r;
	default: return NULL;
	}
}

// rebuild_shaped builds the ops whose parameters choose a variant.
static struct ggml_tensor *rebuild_shaped(struct ggml_context *c, struct ggml_tensor *t) {
	struct ggml_tensor *const *s = t->src;
	const int32_t *p = t->op_params;
	struct ggml_tensor *r = NULL;
	if (t->op == GGML_OP_ROPE) {
		int sections[GGML_MROPE_SECTIONS];
		memcpy(sections, p + 11, sizeof(sections));
		if (p[2] & GGML_ROPE_TYPE_MROPE) {
			return ggml_rope_multi(c, s[0], s[1], s[2], p[1], sections, p[2], p[4], f32(t, 5), f32(t, 6), f32(t, 7), f32(t, 8),
			                       f32(t, 9), f32(t, 10));
		}
		return ggml_rope_ext(c, s[0], s[1], s[2], p[1], p[2], p[4], f32(t, 5), f32(t, 6), f32(t, 7), f32(t, 8), f32(t, 9), f32(t, 10));
	}
	if (t->op == GGML_OP_GLU) {
		enum ggml_glu_op op = (enum ggml_glu_op)p[0];
		r = s[1] != NULL ? ggml_glu_split(c, s[0], s[1], op) : ggml_glu(c, s[0], op, p[1] != 0);
		if (op == GGML_GLU_OP_SWIGLU_OAI) {
			set_f32(r, 2, f32(t, 2));
			set_f32(r, 3, f32(t, 3));
		}
		return r;
	}
	r = rebuild_one(c, t);
	return r != NULL ? r : rebuild_more(c, t);
}

// in_place says whether op has an in-place variant, whose node is a view of its first
// source (its strides).
static bool in_place(enum ggml_op op) {
	switch (op) {
	case GGML_OP_DUP: case GGML_OP_SQR: case GGML_OP_SQRT: case GGML_OP_LOG: case GGML_OP_SIN: case GGML_OP_COS:
	case GGML_OP_ADD: case GGML_OP_ADD1: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV: case GGML_OP_SCALE:
	case GGML_OP_NORM: case GGML_OP_RMS_NORM: case GGML_OP_GROUP_NORM: case GGML_OP_L2_NORM: case GGML_OP_DIAG_MASK_INF:
	case GGML_OP_DIAG_MASK_ZERO: case GGML_OP_SOFT_MAX: case GGML_OP_LEAKY_RELU: case GGML_OP_ROPE: case GGML_OP_UNARY:
	case GGML_OP_FILL:
		return true;
	default:
		return false;
	}
}

// view_within checks SET's and ACC's view of their destination: offset and strides
// non-negative (the kernel reads them as signed 32-bit numbers and adds them with
// wrapping arithmetic), and the whole of the source's elements inside it.
static std::string view_within(const struct ggml_tensor *t) {
	const int32_t *p = t->op_params;
	const struct ggml_tensor *b = t->src[1];
	uint64_t end = (uint64_t)p[3], span = 0;
	uint64_t strides[GGML_MAX_DIMS] = {ggml_element_size(t), (uint64_t)p[0], (uint64_t)p[1], (uint64_t)p[2]};
	for (int k = 0; k < 4; k++) {
		if (p[k] < 0) {
			return "a negative offset or stride in its op params";
		}
	}
	for (int k = 0; k < GGML_MAX_DIMS && ggml_nelements(b) > 0; k++) {
		if (__builtin_mul_overflow((uint64_t)(b->ne[k] - 1), strides[k], &span) || __builtin_add_overflow(end, span, &end)) {
			return "a view whose extent overflows";
		}
	}
	if (ggml_nelements(b) > 0 && (__builtin_add_overflow(end, strides[0], &end) || end > ggml_nbytes(t))) {
		return "a view of " + std::to_string(end) + " bytes into a destination of " + std::to_string(ggml_nbytes(t));
	}
	return "";
}

static bool same_layout(const struct ggml_tensor *x, const struct ggml_tensor *y) {
	return x->type == y->type && memcmp(x->ne, y->ne, sizeof(x->ne)) == 0 && memcmp(x->nb, y->nb, sizeof(x->nb)) == 0;
}

// compare says how node t differs from r, ggml's build of it.
static std::string compare(const struct ggml_tensor *t, const struct ggml_tensor *r) {
	if (r->op != t->op) {
		return "its op params make a " + std::string(ggml_op_name(r->op)) + " node";
	}
	if (t->type != r->type || memcmp(t->ne, r->ne, sizeof(t->ne)) != 0) {
		char buf[256];
		snprintf(buf, sizeof(buf), "%s [%lld, %lld, %lld, %lld], where ggml builds %s [%lld, %lld, %lld, %lld] of its sources",
		         ggml_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
		         ggml_type_name(r->type), (long long)r->ne[0], (long long)r->ne[1], (long long)r->ne[2], (long long)r->ne[3]);
		return buf;
	}
	if (memcmp(t->nb, r->nb, sizeof(t->nb)) != 0 && !(in_place(t->op) && same_layout(t, t->src[0]))) {
		return "strides other than ggml gives it (nor its first source's, in place)";
	}
	if (memcmp(t->op_params, r->op_params, sizeof(t->op_params)) != 0) {
		return "op params other than ggml's constructor sets from them";
	}
	return "";
}

std::string mfnd_rebuild_check(struct ggml_tensor *t) {
	struct ggml_init_params ip = {8 * ggml_tensor_overhead(), NULL, true};
	struct ggml_context *ctx = ggml_init(ip);
	jmp_buf env;
	struct ggml_tensor *r = NULL;
	bool asserted = false;
	if (setjmp(env) == 0) {
		g_check_jmp = &env;
		r = rebuild_shaped(ctx, t);
	} else {
		asserted = true;
	}
	g_check_jmp = NULL;
	std::string why;
	if (asserted) {
		why = std::string("ggml's constructor refuses its sources (") + g_check_msg + ")";
	} else if (r == NULL) {
		why = "an op the worker does not rebuild";
	} else {
		why = compare(t, r);
	}
	if (why.empty() && (t->op == GGML_OP_SET || t->op == GGML_OP_ACC)) {
		why = view_within(t);
	}
	ggml_free(ctx);
	return why;
}
