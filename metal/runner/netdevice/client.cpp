// The network device: a ggml backend device whose buffers and computation live in a
// worker process (worker.cpp), reached over one TCP connection. llama.cpp places the
// layers given to this device in its buffers; ggml's scheduler hands this device's
// backend the sub-graphs of those layers, which are sent to the worker and computed
// there. docs/split-model.md describes the design and the protocol.

#include "nd_device.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>


struct nd_buffer {
	nd_device *d;
	uint64_t base;
};

thread_local mfnd_thread_stats nd_thread = {};

// Once one link has failed the runner serves nothing more (docs/split-model.md,
// Failures): waits on the other links end at once instead of each running into its
// timeout in turn (a stopped worker would otherwise cost a timeout per worker).
std::atomic<bool> nd_link_failed{false};

std::unique_lock<std::mutex> nd_lock(nd_device *d) {
	std::unique_lock<std::mutex> l(d->mu, std::try_to_lock);
	if (!l.owns_lock()) {
		auto start = std::chrono::steady_clock::now();
		l.lock();
		nd_thread.queue_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
	}
	return l;
}

void nd_fail(nd_device *d, const std::string &msg) {
	{
		std::lock_guard<std::mutex> slock(d->smu);
		if (d->err.empty()) {
			nd_link_failed = true;
			d->err = "split worker " + d->addr + ": " + msg;
			fprintf(stderr, "macfleet-runner: %s\n", d->err.c_str());
		}
		d->outs.clear();
	}
	d->pending.clear();
	if (d->fd >= 0) {
		close(d->fd);
		d->fd = -1;
	}
	d->out.clear();
}

void nd_queue(nd_device *d, uint8_t cmd, const void *p, size_t n, const void *extra, size_t extra_n) {
	if (!d->err.empty()) {
		return;
	}
	uint32_t len = (uint32_t)(n + extra_n);
	mfnd_put(d->out, len);
	d->out.push_back(cmd);
	d->out.insert(d->out.end(), (const uint8_t *)p, (const uint8_t *)p + n);
	if (extra_n > 0) {
		d->out.insert(d->out.end(), (const uint8_t *)extra, (const uint8_t *)extra + extra_n);
	}
}

bool nd_flush(nd_device *d) {
	if (!d->err.empty()) {
		return false;
	}
	if (d->out.empty()) {
		return true;
	}
	if (!mfnd_write_all(d->fd, d->out.data(), d->out.size())) {
		nd_fail(d, std::string("the link is lost (sending: ") + strerror(errno) + ")");
		return false;
	}
	{
		std::lock_guard<std::mutex> slock(d->smu);
		d->sent += d->out.size();
	}
	nd_thread.sent += d->out.size();
	d->out.clear();
	d->gen++;
	d->last_sent = std::chrono::steady_clock::now();
	return true;
}

// nd_read_answer reads one answer, counting it; false (and the link failed) on a lost
// link or an error answer.
// Its bytes and round trip count for ts: the calling thread's, or a compute's owner's.
static bool nd_read_answer(nd_device *d, std::vector<uint8_t> &reply, mfnd_thread_stats *ts) {
	uint8_t head[MFND_HEADER];
	if (!mfnd_read_all(d->fd, head, sizeof(head))) {
		bool timeout = errno == EAGAIN || errno == EWOULDBLOCK;
		nd_fail(d, timeout ? "no answer within the link timeout" : "the link is lost (the worker closed it or died)");
		return false;
	}
	uint32_t len;
	memcpy(&len, head, 4);
	reply.resize(len);
	if (len > 0 && !mfnd_read_all(d->fd, reply.data(), len)) {
		nd_fail(d, "the link is lost in the middle of an answer");
		return false;
	}
	{
		std::lock_guard<std::mutex> slock(d->smu);
		d->received += MFND_HEADER + len;
		d->round_trips++;
		ts->received += MFND_HEADER + len;
		ts->round_trips++;
	}
	if (head[4] != 0) {
		nd_fail(d, std::string(reply.begin(), reply.end()));
		return false;
	}
	return true;
}

// nd_computed takes a COMPUTE's answer: the worker's compute time, the bytes it has
// pushed to the next worker so far, and the last node's bytes unless pushed.
static void nd_computed(nd_device *d, const nd_pending &p, const std::vector<uint8_t> &reply) {
	uint64_t ns = 0, peer = 0;
	if (reply.size() >= 2 * sizeof(uint64_t)) {
		memcpy(&ns, reply.data(), sizeof(ns));
		memcpy(&peer, reply.data() + sizeof(ns), sizeof(peer));
	}
	std::lock_guard<std::mutex> slock(d->smu);
	p.owner->owed.computes++;
	p.owner->owed.compute_ns += ns;
	d->computes++;
	d->compute_ns += ns;
	d->peer_sent = std::max(d->peer_sent, peer);
	if (!p.pushed && p.size > 0 && reply.size() == 2 * sizeof(uint64_t) + p.size) {
		d->outs.push_back({p.owner, p.addr, std::vector<uint8_t>(reply.begin() + 2 * sizeof(uint64_t), reply.end())});
	}
}

static bool nd_owns_pending(nd_device *d, nd_backend *owner) {
	for (const nd_pending &p : d->pending) {
		if (p.owner == owner) {
			return true;
		}
	}
	return false;
}

static bool nd_drain_uncounted(nd_device *d, nd_backend *owner) {
	if (!nd_flush(d)) {
		return false;
	}
	std::vector<uint8_t> reply;
	while (!d->pending.empty() && (owner == NULL || nd_owns_pending(d, owner))) {
		// Counted for the compute's own backend, whichever thread reads it.
		if (!nd_read_answer(d, reply, &d->pending.front().owner->owed)) {
			return false;
		}
		nd_pending p = d->pending.front();
		d->pending.pop_front();
		nd_computed(d, p, reply);
	}
	return true;
}

static void nd_count_wait(nd_device *d, std::chrono::steady_clock::time_point start) {
	uint64_t ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
	std::lock_guard<std::mutex> slock(d->smu);
	d->wait_ns += ns;
	nd_thread.wait_ns += ns;
}

bool nd_drain(nd_device *d, nd_backend *owner) {
	if (!d->err.empty() || nd_link_failed) {
		return false;
	}
	// A backend with no answer pending has nothing to wait for: the frames queued are
	// another context's (or go with the next answered command), sent by it.
	if (owner != NULL ? !nd_owns_pending(d, owner) : d->out.empty() && d->pending.empty()) {
		return true;
	}
	auto start = std::chrono::steady_clock::now();
	bool ok = nd_drain_uncounted(d, owner);
	nd_count_wait(d, start);
	return ok;
}

// nd_call sends a command (after the queued ones) and reads its answer, after those
// of the computes before it.
bool nd_call(nd_device *d, uint8_t cmd, const void *p, size_t n, std::vector<uint8_t> &reply) {
	if (nd_link_failed) {
		return false;
	}
	auto start = std::chrono::steady_clock::now();
	nd_queue(d, cmd, p, n);
	bool ok = nd_drain_uncounted(d, NULL) && nd_read_answer(d, reply, &nd_thread);
	nd_count_wait(d, start);
	return ok;
}

void nd_collect(nd_backend *b) {
	std::lock_guard<std::mutex> slock(b->d->smu);
	mfnd_thread_stats &o = b->owed;
	nd_thread.received += o.received;
	nd_thread.round_trips += o.round_trips;
	nd_thread.computes += o.computes;
	nd_thread.compute_ns += o.compute_ns;
	o = {};
}

void nd_drop_outputs(nd_device *d, uint64_t addr, uint64_t size) {
	std::lock_guard<std::mutex> slock(d->smu);
	for (size_t i = 0; i < d->outs.size();) {
		const nd_output &o = d->outs[i];
		if (o.addr < addr + size && addr < o.addr + o.bytes.size()) {
			d->outs.erase(d->outs.begin() + i);
		} else {
			i++;
		}
	}
}

// ---- buffers ----

static void nd_buffer_free(ggml_backend_buffer_t buf) {
	nd_buffer *b = (nd_buffer *)buf->context;
	auto lock = nd_lock(b->d);
	nd_drop_outputs(b->d, b->base, buf->size);
	nd_queue(b->d, MFND_FREE, &b->base, sizeof(b->base));
	{
		std::lock_guard<std::mutex> slock(b->d->smu);
		b->d->allocated -= buf->size;
	}
	delete b;
}

static void *nd_buffer_base(ggml_backend_buffer_t buf) { return (void *)(uintptr_t)((nd_buffer *)buf->context)->base; }

static void nd_buffer_memset(ggml_backend_buffer_t buf, struct ggml_tensor *t, uint8_t value, size_t offset, size_t size) {
	nd_buffer *b = (nd_buffer *)buf->context;
	struct {
		uint64_t addr, size;
		uint8_t value;
	} __attribute__((packed)) m = {(uint64_t)(uintptr_t)t->data + offset, size, value};
	auto lock = nd_lock(b->d);
	nd_drop_outputs(b->d, m.addr, m.size);
	nd_queue(b->d, MFND_MEMSET, &m, sizeof(m));
}

// Weights are not sent: the worker reads them from its own copy of the model file and
// checks them against the hash of the bytes the runner would have sent.
static void nd_buffer_set(ggml_backend_buffer_t buf, struct ggml_tensor *t, const void *data, size_t offset, size_t size) {
	nd_buffer *b = (nd_buffer *)buf->context;
	uint64_t addr = (uint64_t)(uintptr_t)t->data + offset;
	auto lock = nd_lock(b->d);
	nd_drop_outputs(b->d, addr, size);
	if (buf->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS && t->name[0] != 0) {
		mfnd_set_file m = {addr, offset, size, mfnd_hash(data, size), {0}};
		strncpy(m.name, t->name, sizeof(m.name) - 1);
		nd_queue(b->d, MFND_SET_FILE, &m, sizeof(m));
	} else {
		uint64_t h[2] = {addr, size};
		nd_queue(b->d, MFND_SET, h, sizeof(h), data, size);
	}
	if (b->d->out.size() > (4u << 20)) {
		nd_flush(b->d);
	}
}

// nd_cached_output copies [addr, addr+size) from a computed output, if one holds it.
static bool nd_cached_output(nd_device *d, uint64_t addr, void *data, size_t size) {
	std::lock_guard<std::mutex> slock(d->smu);
	for (const nd_output &o : d->outs) {
		if (d->err.empty() && addr >= o.addr && addr + size <= o.addr + o.bytes.size()) {
			memcpy(data, o.bytes.data() + (addr - o.addr), size);
			return true;
		}
	}
	return false;
}

static void nd_buffer_get(ggml_backend_buffer_t buf, const struct ggml_tensor *t, void *data, size_t offset, size_t size) {
	nd_buffer *b = (nd_buffer *)buf->context;
	uint64_t h[2] = {(uint64_t)(uintptr_t)t->data + offset, size};
	std::vector<uint8_t> reply;
	nd_device *d = b->d;
	// Without mu first: another context may be waiting on the worker meanwhile.
	if (nd_cached_output(d, h[0], data, size)) {
		return;
	}
	auto lock = nd_lock(b->d);
	// A compute's answer still pending may carry it.
	if (nd_drain(d, NULL) && nd_cached_output(d, h[0], data, size)) {
		return;
	}
	if (nd_call(b->d, MFND_GET, h, sizeof(h), reply) && reply.size() == size) {
		memcpy(data, reply.data(), size);
		return;
	}
	if (b->d->err.empty() && !nd_link_failed) {
		nd_fail(b->d, "a read returned the wrong size");
	}
	// The interface cannot return an error: the compute that follows fails instead.
	memset(data, 0, size);
}

static bool nd_buffer_cpy(ggml_backend_buffer_t buf, const struct ggml_tensor *src, struct ggml_tensor *dst) {
	if (src->buffer == NULL || src->buffer->buft != buf->buft) {
		return false; // another device: ggml copies through the host
	}
	nd_buffer *b = (nd_buffer *)buf->context;
	uint64_t m[3] = {(uint64_t)(uintptr_t)src->data, (uint64_t)(uintptr_t)dst->data, ggml_nbytes(src)};
	auto lock = nd_lock(b->d);
	nd_drop_outputs(b->d, m[1], m[2]);
	nd_queue(b->d, MFND_COPY, m, sizeof(m));
	return true;
}

static void nd_buffer_clear(ggml_backend_buffer_t buf, uint8_t value) {
	nd_buffer *b = (nd_buffer *)buf->context;
	struct {
		uint64_t base;
		uint8_t value;
	} __attribute__((packed)) m = {b->base, value};
	auto lock = nd_lock(b->d);
	nd_drop_outputs(b->d, b->base, buf->size);
	nd_queue(b->d, MFND_CLEAR, &m, sizeof(m));
}

static const struct ggml_backend_buffer_i nd_buffer_iface = {
	/* free_buffer   */ nd_buffer_free,
	/* get_base      */ nd_buffer_base,
	/* init_tensor   */ NULL,
	/* memset_tensor */ nd_buffer_memset,
	/* set_tensor    */ nd_buffer_set,
	/* get_tensor    */ nd_buffer_get,
	/* cpy_tensor    */ nd_buffer_cpy,
	/* clear         */ nd_buffer_clear,
	/* reset         */ NULL,
};

static const char *nd_buft_name(ggml_backend_buffer_type_t buft) { return ((nd_device *)buft->context)->buft_name.c_str(); }

static ggml_backend_buffer_t nd_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
	nd_device *d = (nd_device *)buft->context;
	uint64_t n = size;
	std::vector<uint8_t> reply;
	auto lock = nd_lock(d);
	if (!nd_call(d, MFND_ALLOC, &n, sizeof(n), reply) || reply.size() != 8) {
		return NULL;
	}
	nd_buffer *b = new nd_buffer{d, 0};
	{
		std::lock_guard<std::mutex> slock(d->smu);
		d->allocated += size;
	}
	memcpy(&b->base, reply.data(), 8);
	return ggml_backend_buffer_init(buft, nd_buffer_iface, b, size);
}

// The worker allocates with its device's buffer type: its alignment and largest
// buffer come with its greeting, and the size a tensor takes in it is what this
// process's device of the same kind answers (the same build's buffer type).
static size_t nd_buft_alignment(ggml_backend_buffer_type_t buft) {
	return (size_t)((nd_device *)buft->context)->info.alignment;
}

static size_t nd_buft_max_size(ggml_backend_buffer_type_t buft) {
	uint64_t m = ((nd_device *)buft->context)->info.max_size;
	return m == 0 || m > SIZE_MAX ? SIZE_MAX : (size_t)m;
}

static size_t nd_buft_alloc_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor *t) {
	return ggml_backend_buft_get_alloc_size(ggml_backend_dev_buffer_type(((nd_device *)buft->context)->local), t);
}

static bool nd_buft_is_host(ggml_backend_buffer_type_t) { return false; }

const struct ggml_backend_buffer_type_i nd_buft_iface = {
	/* get_name       */ nd_buft_name,
	/* alloc_buffer   */ nd_buft_alloc,
	/* get_alignment  */ nd_buft_alignment,
	/* get_max_size   */ nd_buft_max_size,
	/* get_alloc_size */ nd_buft_alloc_size,
	/* is_host        */ nd_buft_is_host,
	/* noalloc_buffer */ NULL,
};
