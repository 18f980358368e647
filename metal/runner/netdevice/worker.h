// The worker's state for one runner's session (worker.cpp: the commands;
// worker_peer.cpp: the peer links to the previous and next shards' workers).
#pragma once

#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "../src/ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "wire.h"
#include "worker_device.h"

// nd_part is one file of the worker's model: the only one, or a part of a model stored
// in parts (NAME-0000i-of-0000N.gguf), with its header; file is -1 for a part its Mac
// does not store (its agent fetches only the parts holding its layers).
struct nd_part {
	std::string path;
	int file = -1;
	struct gguf_context *gguf = NULL;
};

struct nd_worker {
	int sock = -1;
	// parts are the model's files, the one named first (worker_parts.cpp).
	std::vector<nd_part> parts;
	ggml_backend_dev_t dev = NULL;
	ggml_backend_buffer_type_t buft = NULL;
	ggml_backend_t backend = NULL;
	struct ggml_threadpool *pool = NULL; // a CPU backend's, kept for the session as the runner keeps its own
	std::map<uint64_t, ggml_backend_buffer_t> buffers; // by base address
	std::string err; // the first error of a queued command, reported by the next answered one
	std::vector<uint8_t> msg, out;
	std::vector<uint8_t> stage; // bytes on their way into or out of a buffer that is not host memory
	uint64_t file_size = 0, header_hash = 0;
	int threads = 1;
	// memory is what the worker answers as its free and total memory (mfnd_serve), and
	// the bound on the bytes of its buffers (allocated); idle_ms ends a session after
	// that long without a command (0: never).
	uint64_t memory = 0, allocated = 0;
	int idle_ms = 0;
	// The peer links (worker_peer.cpp): session is the id the runner gave this session
	// at its greeting, which the previous worker's link must present; next is --next,
	// the address of the next shard's worker; peer_out the link to it (pushes), peer_in
	// the link from the previous one (awaits; handed over by mfnd_peer_accept, under
	// nd_peer_mu). pushed counts the bytes pushed, framing included.
	uint8_t session[16] = {0};
	int timeout_ms = 0;
	std::string next;
	int peer_out = -1, peer_in = -1;
	uint64_t pushed = 0;
	struct peer_push {
		bool ok;
		std::vector<uint8_t> bytes; // or the message of the previous worker's error
	};
	std::map<uint64_t, peer_push> stash; // pushes read while awaiting another sequence number (MFND_MAX_STASH, MFND_MAX_TRANSFER bytes)
	uint64_t stashed = 0;                 // the bytes in stash

	~nd_worker() {
		end_session();
		for (auto &b : buffers) {
			ggml_backend_buffer_free(b.second);
		}
		if (backend != NULL) {
			ggml_backend_free(backend);
		}
		if (pool != NULL) {
			ggml_threadpool_free(pool);
		}
		for (nd_part &p : parts) {
			if (p.gguf != NULL) {
				gguf_free(p.gguf);
			}
			if (p.file >= 0) {
				close(p.file);
			}
		}
	}

	// find returns the buffer holding [addr, addr+n), or NULL.
	ggml_backend_buffer_t find(uint64_t addr, uint64_t n) {
		auto it = buffers.upper_bound(addr);
		if (it == buffers.begin()) {
			return NULL;
		}
		--it;
		ggml_backend_buffer_t b = it->second;
		uint64_t base = it->first, size = ggml_backend_buffer_get_size(b);
		return addr + n <= base + size && addr + n >= addr ? b : NULL;
	}

	// mem is find, failing the session's command when the range is outside them.
	ggml_backend_buffer_t mem(uint64_t addr, uint64_t n, const char *what) {
		ggml_backend_buffer_t b = find(addr, n);
		if (b == NULL) {
			fail(std::string(what) + ": an address outside the worker's buffers");
		}
		return b;
	}

	void fail(const std::string &e) {
		if (err.empty()) {
			err = e;
		}
	}

	bool reply(uint8_t status, const void *p, size_t n) {
		uint8_t head[MFND_HEADER];
		uint32_t len = (uint32_t)n;
		memcpy(head, &len, 4);
		head[4] = status;
		return mfnd_write_all(sock, head, sizeof(head)) && (n == 0 || mfnd_write_all(sock, p, n));
	}

	// answer replies with p, or with the first queued error.
	bool answer(const void *p, size_t n) {
		if (!err.empty()) {
			return reply(1, err.data(), err.size());
		}
		return reply(0, p, n);
	}

	// The current graph of each stream, updated by each compute message.
	struct graph {
		std::vector<mfnd_tensor> tensors;
		std::vector<uint32_t> nodes;
	};
	std::vector<graph> graphs;

	bool hello();
	bool peer();
	void await();
	void push(uint64_t seq, const void *p, size_t n);
	void begin_session(const uint8_t id[16], int timeout);
	void end_session();
	void set_file();
	std::string open_parts(const char *model_path);
	// find_tensor is the part holding the tensor name and its id there; NULL, the
	// session's command failed with the reason, when none of the parts stored does.
	const nd_part *find_tensor(const char *name, int64_t *id);
	graph *update(mfnd_graph *h);
	std::vector<ggml_tensor *> build(struct ggml_context *ctx, const std::vector<mfnd_tensor> &tensors);
	bool check(const graph &gr);
	bool check_nodes(const graph &gr, const std::vector<ggml_tensor *> &ts);
	// check_rows refuses a graph whose GET_ROWS or SET_ROWS node reads row indices,
	// not computed by the graph, outside its table's rows (worker_rows.cpp).
	bool check_rows(const graph &gr, const std::vector<ggml_tensor *> &ts);
	bool alloc(uint64_t size);
	bool get(uint64_t addr, uint64_t n);
	bool compute();
	bool serve_one(uint8_t cmd);
};
