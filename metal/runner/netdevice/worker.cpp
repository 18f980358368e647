// The worker: holds the buffers a runner's network device allocates in it, fills the
// weights from its own copy of the model file, and computes the graphs it is sent with
// the backend of its device: the first GPU ggml registered (Metal on Apple Silicon),
// else the CPU (worker_device.cpp). One runner at a time; docs/split-model.md
// describes the protocol.

#include "netdevice.h"
#include "worker.h"
#include "worker_check.h"
#include "worker_rebuild.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <unordered_map>

#include "../src/ggml-backend-impl.h"
#include "../src/ggml-impl.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"

bool nd_worker::hello() {
	mfnd_hello h;
	memset(&h, 0, sizeof(h));
	// The version first, from a greeting of any size: another version's may differ.
	memcpy(&h, msg.data(), std::min(msg.size(), sizeof(h)));
	std::string e;
	if (msg.size() < 8 || h.magic != MFND_MAGIC || h.version != MFND_VERSION) {
		e = "protocol version " + std::to_string(h.version) + " is not this worker's " + std::to_string(MFND_VERSION);
	} else if (msg.size() != sizeof(h)) {
		e = "malformed greeting";
	} else if (h.ptr_size != sizeof(void *) || h.endian != 0x01020304u) {
		e = "the runner's pointer size or byte order differs from the worker's";
	} else if (h.file_size != file_size || h.header_hash != header_hash) {
		e = "the worker's model file differs from the runner's (size " + std::to_string(file_size) + " vs " +
		    std::to_string(h.file_size) + ", or its metadata and tensor table differ)";
	}
	if (!e.empty()) {
		fail(e);
		reply(1, e.data(), e.size());
		return false;
	}
	begin_session(h.session, (int)h.timeout_ms);
	mfnd_hello_reply r;
	memset(&r, 0, sizeof(r));
	r.version = MFND_VERSION;
	r.threads = (uint32_t)threads;
	r.mem_free = r.mem_total = memory;
	r.has_next = !next.empty();
	r.dev_type = (uint32_t)ggml_backend_dev_type(dev);
	r.alignment = ggml_backend_buft_get_alignment(buft);
	r.max_size = ggml_backend_buft_get_max_size(buft);
	r.idle_ms = (uint32_t)idle_ms;
	snprintf(r.dev_name, sizeof(r.dev_name), "%s", ggml_backend_dev_name(dev));
	return reply(0, &r, sizeof(r));
}

void nd_worker::set_file() {
	mfnd_set_file m;
	memcpy(&m, msg.data(), sizeof(m));
	m.name[sizeof(m.name) - 1] = 0;
	int64_t id = -1;
	const nd_part *part = find_tensor(m.name, &id);
	if (part == NULL) {
		return;
	}
	size_t tsize = gguf_get_tensor_size(part->gguf, id);
	ggml_backend_buffer_t b = mem(m.addr, m.size, m.name);
	if (b == NULL) {
		return;
	}
	if (m.offset > tsize || m.size > tsize - m.offset) {
		fail(std::string("tensor ") + m.name + ": a write past its end: the worker's file differs");
		return;
	}
	// A host buffer is read into directly; any other through a staging copy.
	bool host = mfnd_host(b);
	if (!host) {
		stage.resize(m.size);
	}
	uint8_t *dst = host ? (uint8_t *)(uintptr_t)m.addr : stage.data();
	off_t at = (off_t)(gguf_get_data_offset(part->gguf) + gguf_get_tensor_offset(part->gguf, id) + m.offset);
	for (uint64_t done = 0; done < m.size;) {
		ssize_t k = pread(part->file, dst + done, m.size - done, at + (off_t)done);
		if (k <= 0) {
			fail(std::string("tensor ") + m.name + ": reading the worker's model file: " + strerror(errno));
			return;
		}
		done += (uint64_t)k;
	}
	if (!host) {
		mfnd_range_set(b, m.addr, dst, m.size);
	}
	if (mfnd_hash(dst, m.size) != m.hash) {
		fail(std::string("tensor ") + m.name + ": its bytes differ from the runner's: the worker's file differs");
	}
}

// update applies a graph message (wire.h, mfnd_graph) to its stream's previous graph
// and returns that stream's graph, NULL for a malformed message.
nd_worker::graph *nd_worker::update(mfnd_graph *h) {
	if (msg.size() < sizeof(*h)) {
		return NULL;
	}
	memcpy(h, msg.data(), sizeof(*h));
	size_t rec = sizeof(uint32_t) + sizeof(mfnd_tensor);
	if (msg.size() != sizeof(*h) + (size_t)h->n_changed * rec + (h->nodes_sent ? (size_t)h->n_nodes * 4 : 0) ||
	    h->stream >= MFND_MAX_STREAMS || h->n_tensors > MFND_MAX_GRAPH_TENSORS || h->n_nodes > MFND_MAX_GRAPH_TENSORS ||
	    h->n_changed > h->n_tensors) {
		return NULL;
	}
	if (graphs.size() <= h->stream) {
		graphs.resize(h->stream + 1);
	}
	// The streams' graphs together stay within MFND_MAX_HELD_TENSORS.
	size_t held = h->n_tensors;
	for (size_t i = 0; i < graphs.size(); i++) {
		held += i == h->stream ? 0 : graphs[i].tensors.size();
	}
	if (held > MFND_MAX_HELD_TENSORS) {
		return NULL;
	}
	graph *gr = &graphs[h->stream];
	std::vector<mfnd_tensor> &tensors = gr->tensors;
	std::vector<uint32_t> &nodes = gr->nodes;
	tensors.resize(h->n_tensors);
	const uint8_t *p = msg.data() + sizeof(*h);
	for (uint32_t i = 0; i < h->n_changed; i++, p += rec) {
		uint32_t at;
		memcpy(&at, p, 4);
		if (at >= h->n_tensors) {
			return NULL;
		}
		memcpy(&tensors[at], p + 4, sizeof(mfnd_tensor));
	}
	if (h->nodes_sent) {
		nodes.resize(h->n_nodes);
		memcpy(nodes.data(), p, (size_t)h->n_nodes * 4);
	}
	if (nodes.size() != h->n_nodes) {
		return NULL;
	}
	for (uint32_t n : nodes) {
		if (n >= h->n_tensors) {
			return NULL;
		}
	}
	return gr;
}

// check refuses a graph with a record mfnd_check_record refuses, or whose bytes are
// not all within one of the worker's buffers, before ggml sees any of it.
bool nd_worker::check(const graph &gr) {
	for (size_t i = 0; i < gr.tensors.size(); i++) {
		const mfnd_tensor &r = gr.tensors[i];
		uint64_t bytes = 0;
		std::string why = mfnd_check_record(r, &bytes);
		if (why.empty() && bytes > 0 && (r.data == 0 || find(r.data, bytes) == NULL)) {
			why = "its " + std::to_string(bytes) + " bytes are not within one of the worker's buffers";
		}
		if (!why.empty()) {
			fail("graph tensor " + std::to_string(i) + ": " + why);
			return false;
		}
	}
	return true;
}

// check_nodes refuses a graph with a node missing a source its op reads, or one the
// worker's backend does not compute.
bool nd_worker::check_nodes(const graph &gr, const std::vector<ggml_tensor *> &ts) {
	for (uint32_t n : gr.nodes) {
		struct ggml_tensor *t = ts[n];
		for (int k = 0; k < mfnd_op_sources(t->op); k++) {
			if (t->src[k] == NULL) {
				fail(std::string("graph node ") + std::to_string(n) + " (" + ggml_op_name(t->op) + "): its source " +
				     std::to_string(k) + " is not a tensor of the graph");
				return false;
			}
		}
		std::string why = t->op == GGML_OP_NONE ? "" : mfnd_rebuild_check(t);
		if (!why.empty()) {
			fail(std::string("graph node ") + std::to_string(n) + " (" + ggml_op_desc(t) + "): " + why);
			return false;
		}
		if (t->op != GGML_OP_NONE && !ggml_backend_supports_op(backend, t)) {
			fail(std::string("graph node ") + std::to_string(n) + " (" + ggml_op_desc(t) + "): the worker's " +
			     ggml_backend_dev_name(dev) + " backend does not compute it with these types");
			return false;
		}
	}
	return true;
}

// build makes the tensors of the current graph in ctx, in the worker's buffers.
std::vector<ggml_tensor *> nd_worker::build(struct ggml_context *ctx, const std::vector<mfnd_tensor> &tensors) {
	std::vector<ggml_tensor *> out(tensors.size());
	std::unordered_map<uint64_t, ggml_tensor *> byid;
	for (size_t i = 0; i < tensors.size(); i++) {
		const mfnd_tensor &r = tensors[i];
		struct ggml_tensor *t = ggml_new_tensor(ctx, (enum ggml_type)r.type, GGML_MAX_DIMS, r.ne);
		for (int k = 0; k < GGML_MAX_DIMS; k++) {
			t->nb[k] = r.nb[k];
		}
		t->op = (enum ggml_op)r.op;
		t->flags = r.flags;
		memcpy(t->op_params, r.op_params, sizeof(t->op_params));
		t->view_offs = r.view_offs;
		t->data = (void *)(uintptr_t)r.data;
		// check() found [data, data + its bytes) within one buffer, or no bytes.
		t->buffer = r.data != 0 ? find(r.data, ggml_nbytes(t)) : NULL;
		byid[r.id] = out[i] = t;
	}
	auto ref = [&](uint64_t id) -> ggml_tensor * {
		auto it = byid.find(id);
		return id != 0 && it != byid.end() ? it->second : NULL;
	};
	for (size_t i = 0; i < tensors.size(); i++) {
		for (int k = 0; k < GGML_MAX_SRC; k++) {
			out[i]->src[k] = ref(tensors[i].src[k]);
		}
		out[i]->view_src = ref(tensors[i].view_src);
	}
	return out;
}

bool nd_worker::compute() {
	mfnd_graph h;
	memset(&h, 0, sizeof(h));
	graph *gr = update(&h);
	bool push_out = (h.flags & MFND_GRAPH_PUSH) != 0;
	if (gr == NULL) {
		fail("malformed graph (or one above the worker's bounds on tensors and nodes)");
		graphs.clear();
	} else if (err.empty() && !check(*gr)) {
		graphs.clear();
	}
	if (!err.empty()) {
		if (push_out) {
			push(h.push_seq, NULL, 0); // the next worker's await fails with the error
		}
		return answer(NULL, 0);
	}
	const std::vector<mfnd_tensor> &tensors = gr->tensors;
	const std::vector<uint32_t> &nodes = gr->nodes;
	struct ggml_init_params ip = {tensors.size() * ggml_tensor_overhead() + ggml_graph_overhead_custom(nodes.size(), false), NULL, true};
	struct ggml_context *ctx = ggml_init(ip);
	std::vector<ggml_tensor *> ts = build(ctx, tensors);
	bool refused = !check_nodes(*gr, ts) || !check_rows(*gr, ts); // the stream's graph is dropped below, once unused
	struct ggml_cgraph *g = ggml_new_graph_custom(ctx, nodes.size(), false);
	// The nodes are placed as they are, so the graph's visited set and use counts stay
	// empty: a backend that fuses operations (Metal) then fuses none, and always
	// writes every node, some of which the runner's next split may read (the worker
	// sees only its split, not who uses its results).
	for (uint32_t n : nodes) {
		g->nodes[g->n_nodes++] = ts[n];
	}
	auto start = std::chrono::steady_clock::now();
	if (err.empty() && ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
		fail(std::string("the worker's ") + ggml_backend_dev_name(dev) + " backend failed to compute the graph");
	}
	uint64_t ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
	// The answer: the compute time, the bytes pushed so far, then the last node's bytes,
	// which the runner reads next, unless they go to the next worker (the node is read
	// from the worker's memory here only, for either).
	struct ggml_tensor *last = nodes.empty() ? NULL : ts[nodes.back()];
	size_t n = err.empty() && last != NULL && last->buffer != NULL ? ggml_nbytes(last) : 0;
	if (!push_out && n > MFND_MAX_OUTPUT) {
		n = 0;
	}
	const size_t head = 2 * sizeof(uint64_t);
	out.resize(head + n);
	if (n > 0) {
		mfnd_range_get(last->buffer, (uint64_t)(uintptr_t)last->data, out.data() + head, n);
	}
	if (push_out) {
		push(h.push_seq, n > 0 ? out.data() + head : NULL, n);
		out.resize(head);
	}
	memcpy(out.data(), &ns, sizeof(ns));
	memcpy(out.data() + sizeof(ns), &pushed, sizeof(pushed));
	bool ok = answer(out.data(), out.size());
	ggml_free(ctx);
	if (refused) {
		graphs.clear();
	}
	return ok;
}

// alloc serves MFND_ALLOC: a buffer of size bytes within the worker's memory,
// cleared, so that no byte a previous session left in that memory is readable.
bool nd_worker::alloc(uint64_t size) {
	std::string e;
	if (msg.size() != sizeof(uint64_t)) {
		e = "malformed allocation";
	} else if (size > memory - std::min(memory, allocated)) {
		e = "the worker cannot allocate " + std::to_string(size) + " bytes: " + std::to_string(allocated) + " of its " +
		    std::to_string(memory) + " (--memory) are allocated";
	} else if (buffers.size() >= MFND_MAX_BUFFERS) {
		e = "the worker holds " + std::to_string(buffers.size()) + " buffers, its most";
	}
	ggml_backend_buffer_t b = e.empty() ? ggml_backend_buft_alloc_buffer(buft, size) : NULL;
	if (b == NULL) {
		if (e.empty()) {
			e = "the worker cannot allocate " + std::to_string(size) + " bytes";
		}
		return reply(1, e.data(), e.size());
	}
	ggml_backend_buffer_clear(b, 0);
	uint64_t base = (uint64_t)(uintptr_t)ggml_backend_buffer_get_base(b);
	if (buffers.count(base) != 0) {
		// A zero-sized buffer may have no base of its own: one per base.
		ggml_backend_buffer_free(b);
		e = "the worker cannot allocate " + std::to_string(size) + " bytes at a base of their own";
		return reply(1, e.data(), e.size());
	}
	buffers[base] = b;
	allocated += ggml_backend_buffer_get_size(b);
	return answer(&base, sizeof(base));
}

// get serves MFND_GET: answers the n bytes at addr.
bool nd_worker::get(uint64_t addr, uint64_t n) {
	if (n > MFND_MAX_TRANSFER) {
		fail("a read of " + std::to_string(n) + " bytes, above the worker's " + std::to_string(MFND_MAX_TRANSFER));
	}
	ggml_backend_buffer_t b = err.empty() ? mem(addr, n, "get") : NULL;
	if (b == NULL) {
		return answer(NULL, 0);
	}
	if (mfnd_host(b)) {
		return answer((const void *)(uintptr_t)addr, n);
	}
	stage.resize(n);
	mfnd_range_get(b, addr, stage.data(), n);
	return answer(stage.data(), n);
}

// serve_one handles one command whose payload is in msg; false ends the session.
bool nd_worker::serve_one(uint8_t cmd) {
	uint64_t a[3] = {0, 0, 0};
	memcpy(a, msg.data(), std::min(msg.size(), sizeof(a)));
	switch (cmd) {
	case MFND_ALLOC:
		return alloc(a[0]);
	case MFND_FREE: {
		auto it = buffers.find(a[0]);
		if (it == buffers.end()) {
			fail("freeing a buffer the worker does not hold");
		} else {
			allocated -= std::min(allocated, (uint64_t)ggml_backend_buffer_get_size(it->second));
			ggml_backend_buffer_free(it->second);
			buffers.erase(it);
		}
		return true;
	}
	case MFND_CLEAR: {
		auto it = buffers.find(a[0]);
		if (it == buffers.end() || msg.size() < 9) {
			fail("clearing a buffer the worker does not hold");
		} else {
			ggml_backend_buffer_clear(it->second, msg[8]);
		}
		return true;
	}
	case MFND_SET: {
		ggml_backend_buffer_t b = msg.size() == 16 + a[1] ? mem(a[0], a[1], "set") : NULL;
		if (b != NULL) {
			mfnd_range_set(b, a[0], msg.data() + 16, a[1]);
		}
		return true;
	}
	case MFND_SET_FILE:
		if (msg.size() != sizeof(mfnd_set_file)) {
			fail("malformed weight write");
		} else {
			set_file();
		}
		return true;
	case MFND_GET:
		return get(a[0], a[1]);
	case MFND_COPY: {
		ggml_backend_buffer_t src = mem(a[0], a[2], "copy"), dst = mem(a[1], a[2], "copy");
		if (src != NULL && dst != NULL) {
			mfnd_range_copy(src, a[0], dst, a[1], a[2], stage);
		}
		return true;
	}
	case MFND_MEMSET: {
		ggml_backend_buffer_t b = msg.size() == 17 ? mem(a[0], a[1], "memset") : NULL;
		if (b != NULL) {
			mfnd_range_fill(b, a[0], msg[16], a[1]);
		}
		return true;
	}
	case MFND_COMPUTE:
		return compute();
	case MFND_STATUS:
		return answer(NULL, 0);
	case MFND_PEER:
		return peer();
	case MFND_AWAIT:
		await();
		return true;
	case MFND_PUSH: {
		if (msg.size() != sizeof(mfnd_push) || a[2] > MFND_MAX_TRANSFER) {
			fail("malformed push (or one above the worker's " + std::to_string(MFND_MAX_TRANSFER) + " bytes)");
		}
		ggml_backend_buffer_t b = err.empty() ? mem(a[1], a[2], "push") : NULL;
		const void *src = NULL;
		if (b != NULL && mfnd_host(b)) {
			src = (const void *)(uintptr_t)a[1];
		} else if (b != NULL) {
			stage.resize(a[2]);
			mfnd_range_get(b, a[1], stage.data(), a[2]);
			src = stage.data();
		}
		push(a[0], src, src != NULL ? a[2] : 0); // with an error, the error
		return true;
	}
	default: {
		std::string e = "unknown command " + std::to_string(cmd);
		reply(1, e.data(), e.size());
		return false;
	}
	}
}


extern "C" int mfnd_serve(int fd, const char *model_path, int choice, int threads, uint64_t memory, const char *next, int idle_ms,
                          char *err, size_t errlen) {
	mfnd_install_abort_hook();
	nd_worker w;
	w.next = next != NULL ? next : "";
	w.sock = fd;
	w.threads = threads > 0 ? threads : 1;
	w.memory = memory;
	w.idle_ms = idle_ms > 0 ? idle_ms : 0;
	// Timeouts are set below; keepalive finds a vanished peer.
	mfnd_socket_options(fd, 0);
	std::string e = mfnd_file_identity(model_path, &w.file_size, &w.header_hash);
	if (e.empty()) {
		e = w.open_parts(model_path);
	}
	if (e.empty() && (w.dev = mfnd_pick_device(choice, &e)) != NULL) {
		w.buft = ggml_backend_dev_buffer_type(w.dev);
		if ((w.backend = ggml_backend_dev_init(w.dev, NULL)) == NULL) {
			e = std::string("cannot start the ") + ggml_backend_dev_name(w.dev) + " backend";
		}
	}
	if (e.empty() && w.memory == 0) {
		// No budget given: the device's memory (the CPU's is the Mac's physical memory,
		// a GPU's what ggml reports it may use).
		size_t free = 0, total = 0;
		ggml_backend_dev_memory(w.dev, &free, &total);
		w.memory = total;
	}
	bool greeted = false;
	// A connection greets within MFND_GREETING_MS in a small frame; a session then
	// ends after idle_ms without a command (its runner sends a STATUS before that).
	mfnd_socket_timeouts(fd, MFND_GREETING_MS);
	for (;;) {
		uint8_t cmd = 0;
		std::string r = mfnd_read_frame(fd, greeted ? MFND_MAX_FRAME : MFND_MAX_GREETING_FRAME, &cmd, w.msg);
		if (r == MFND_EOF) {
			break; // the runner disconnected
		}
		if (!r.empty()) {
			e = r != MFND_TIMEOUT ? r
			    : greeted     ? "the session was idle for " + std::to_string(w.idle_ms / 1000) + "s (--idle-timeout)"
			                  : "no greeting within " + std::to_string(MFND_GREETING_MS / 1000) + "s";
			w.reply(1, e.data(), e.size());
			break;
		}
		if (!greeted) {
			if (cmd != MFND_HELLO) {
				e = "the first command is not a greeting";
				w.reply(1, e.data(), e.size());
			} else if (!e.empty()) {
				w.reply(1, e.data(), e.size());
			} else if (w.hello()) {
				if (ggml_backend_is_cpu(w.backend)) {
					ggml_backend_cpu_set_n_threads(w.backend, w.threads);
					struct ggml_threadpool_params tp = ggml_threadpool_params_default(w.threads);
					if ((w.pool = ggml_threadpool_new(&tp)) != NULL) {
						ggml_backend_cpu_set_threadpool(w.backend, w.pool);
					}
				}
				greeted = true;
				mfnd_socket_timeouts(fd, w.idle_ms);
				continue;
			} else {
				e = "refused the runner: " + w.err;
			}
			break;
		}
		if (!w.serve_one(cmd)) {
			e = "the session ended: " + (w.err.empty() ? std::string("the link failed") : w.err);
			break;
		}
	}
	close(fd);
	if (!e.empty()) {
		snprintf(err, errlen, "%s", e.c_str());
		return -1;
	}
	return 0;
}
