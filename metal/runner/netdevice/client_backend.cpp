// The network device's backend and device: graphs the scheduler assigns to the device
// are serialized and computed by the worker; the device answers llama.cpp's questions
// about memory, buffers and supported operations.

#include "netdevice.h"
#include "wire.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <unordered_map>
#include <unordered_set>

#include "../src/ggml-impl.h"
#include "nd_device.h"

static mfnd_tensor nd_record(const struct ggml_tensor *t, const std::unordered_set<const ggml_tensor *> &sent) {
	mfnd_tensor m;
	memset(&m, 0, sizeof(m));
	m.id = (uint64_t)(uintptr_t)t;
	m.type = t->type;
	m.op = t->op;
	m.flags = t->flags;
	for (int i = 0; i < GGML_MAX_DIMS; i++) {
		m.ne[i] = t->ne[i];
		m.nb[i] = t->nb[i];
	}
	memcpy(m.op_params, t->op_params, sizeof(m.op_params));
	for (int i = 0; i < GGML_MAX_SRC; i++) {
		// Sources outside the message (computed elsewhere, never read here) stay NULL.
		if (t->src[i] != NULL && sent.count(t->src[i])) {
			m.src[i] = (uint64_t)(uintptr_t)t->src[i];
		}
	}
	if (t->view_src != NULL && sent.count(t->view_src)) {
		m.view_src = (uint64_t)(uintptr_t)t->view_src;
	}
	m.view_offs = t->view_offs;
	m.data = (uint64_t)(uintptr_t)t->data;
	return m;
}

// nd_serialize writes a graph (wire.h, mfnd_graph): the nodes, their sources and the
// tensors those view, as the records that differ from the previous graph's.
static void nd_serialize(nd_backend *d, struct ggml_cgraph *g, std::vector<uint8_t> &v) {
	std::unordered_set<const ggml_tensor *> seen;
	std::vector<const ggml_tensor *> list;
	std::vector<uint32_t> nodes;
	auto add = [&](const ggml_tensor *t) {
		for (; t != NULL && !seen.count(t); t = t->view_src) {
			seen.insert(t);
			list.push_back(t);
		}
	};
	for (int i = 0; i < g->n_nodes; i++) {
		add(g->nodes[i]);
		for (int s = 0; s < GGML_MAX_SRC; s++) {
			add(g->nodes[i]->src[s]);
		}
	}
	std::unordered_map<const ggml_tensor *, uint32_t> index;
	for (uint32_t i = 0; i < list.size(); i++) {
		index[list[i]] = i;
	}
	for (int i = 0; i < g->n_nodes; i++) {
		nodes.push_back(index[g->nodes[i]]);
	}
	mfnd_graph h = {(uint32_t)list.size(), (uint32_t)nodes.size(), 0, nodes != d->last_nodes, d->stream, 0, 0};
	v.resize(sizeof(h));
	d->last_tensors.resize(list.size());
	for (uint32_t i = 0; i < list.size(); i++) {
		mfnd_tensor m = nd_record(list[i], seen);
		if (memcmp(&m, &d->last_tensors[i], sizeof(m)) != 0 || m.id == 0) {
			mfnd_put(v, i);
			mfnd_put(v, m);
			d->last_tensors[i] = m;
			h.n_changed++;
		}
	}
	if (h.nodes_sent) {
		v.insert(v.end(), (const uint8_t *)nodes.data(), (const uint8_t *)(nodes.data() + nodes.size()));
		d->last_nodes = nodes;
	}
	memcpy(v.data(), &h, sizeof(h));
}

static const char *nd_backend_name(ggml_backend_t b) { return ((nd_backend *)b->context)->d->name.c_str(); }

static void nd_backend_free(ggml_backend_t b) {
	nd_backend *nb = (nd_backend *)b->context;
	nd_device *d = nb->d;
	{
		std::lock_guard<std::mutex> lock(d->mu);
		nd_drain(d, nb); // its answers name it
		d->streams[nb->stream] = false;
		std::lock_guard<std::mutex> slock(d->smu);
		for (size_t i = 0; i < d->outs.size(); i++) {
			if (d->outs[i].owner == nb) {
				d->outs.erase(d->outs.begin() + i);
				break;
			}
		}
	}
	delete nb;
	delete b;
}

// nd_backend_compute queues the graph's COMPUTE and returns: the answer is read by
// synchronize, or before any later answer of the link (ggml's scheduler synchronizes
// a backend before it reads its outputs or overwrites its inputs). Until it is sent, a
// copy of its last node to the next worker can make it a push (nd_backend_cpy_async).
static enum ggml_status nd_backend_compute(ggml_backend_t b, struct ggml_cgraph *g, int) {
	nd_backend *nb = (nd_backend *)b->context;
	nd_device *d = nb->d;
	std::vector<uint8_t> msg;
	auto lock = nd_lock(d);
	nd_collect(nb);
	if (!d->err.empty() || nd_link_failed) {
		return GGML_STATUS_FAILED;
	}
	nd_serialize(nb, g, msg);
	{
		// This backend's previous output is replaced (its graphs reuse their buffers).
		std::lock_guard<std::mutex> slock(d->smu);
		for (size_t i = 0; i < d->outs.size(); i++) {
			if (d->outs[i].owner == nb) {
				d->outs.erase(d->outs.begin() + i);
				break;
			}
		}
	}
	const struct ggml_tensor *last = g->n_nodes > 0 ? g->nodes[g->n_nodes - 1] : NULL;
	nb->queued = true;
	nb->queued_gen = d->gen;
	nb->queued_at = d->out.size() + MFND_HEADER;
	nd_queue(d, MFND_COMPUTE, msg.data(), msg.size());
	d->pending.push_back({nb, last != NULL ? (uint64_t)(uintptr_t)last->data : 0, last != NULL ? ggml_nbytes(last) : 0, false});
	return GGML_STATUS_SUCCESS;
}

// nd_backend_synchronize sends what is queued and reads this backend's pending
// answers. It cannot return an error: a failed link or compute is kept (the device's
// error, which the runner checks after every decode) and the next compute fails.
static void nd_backend_synchronize(ggml_backend_t b) {
	nd_backend *nb = (nd_backend *)b->context;
	auto lock = nd_lock(nb->d);
	nd_drain(nb->d, nb);
	nd_collect(nb);
}

static bool nd_is_backend(ggml_backend_t b);

// nd_backend_cpy_async copies a split's input from the previous shard's worker
// straight to this one when the previous worker has a peer link to this one: the
// previous worker pushes the tensor as the link's next sequence number, and this
// worker is sent an AWAIT of that number into dst, ahead of its own inputs and COMPUTE.
// The push rides on the previous worker's COMPUTE when the tensor is that queued
// COMPUTE's last node (the hidden state after its layers), which then answers without
// it; else it is a PUSH after it (the worker runs commands in order, so after the
// COMPUTE that wrote the tensor). Any other copy goes through the runner, as ggml does
// without this (returning false).
static bool nd_backend_cpy_async(ggml_backend_t src_b, ggml_backend_t dst_b, const struct ggml_tensor *src, struct ggml_tensor *dst) {
	if (!nd_is_backend(src_b) || !nd_is_backend(dst_b)) {
		return false;
	}
	nd_backend *sb = (nd_backend *)src_b->context;
	nd_device *sd = sb->d, *dd = ((nd_backend *)dst_b->context)->d;
	size_t size = ggml_nbytes(src);
	if (sd->next != dd || src->buffer == NULL || src->buffer->buft != &sd->buft || dst->buffer == NULL ||
	    dst->buffer->buft != &dd->buft || ggml_nbytes(dst) != size || size == 0 || size >= MFND_MAX_FRAME / 2 ||
	    !ggml_is_contiguous(src) || !ggml_is_contiguous(dst)) {
		return false;
	}
	mfnd_await a = {0, (uint64_t)(uintptr_t)dst->data, size};
	{
		auto lock = nd_lock(sd);
		if (!sd->err.empty()) {
			return false;
		}
		a.seq = ++sd->push_seq;
		uint64_t addr = (uint64_t)(uintptr_t)src->data;
		if (sb->queued && sb->queued_gen == sd->gen && !sd->pending.empty() && sd->pending.back().owner == sb && size <= MFND_MAX_OUTPUT &&
		    sd->pending.back().addr == addr && sd->pending.back().size == size && !sd->pending.back().pushed) {
			mfnd_graph h;
			memcpy(&h, sd->out.data() + sb->queued_at, sizeof(h));
			h.flags |= MFND_GRAPH_PUSH;
			h.push_seq = a.seq;
			memcpy(sd->out.data() + sb->queued_at, &h, sizeof(h));
			sd->pending.back().pushed = true;
		} else {
			mfnd_push p = {a.seq, addr, size};
			nd_queue(sd, MFND_PUSH, &p, sizeof(p));
		}
		sb->queued = false;
		if (!nd_flush(sd)) {
			return false;
		}
	}
	auto lock = nd_lock(dd);
	nd_drop_outputs(dd, a.addr, size);
	nd_queue(dd, MFND_AWAIT, &a, sizeof(a));
	// Sent now, so that the worker reads the push as soon as it comes.
	nd_flush(dd);
	return true;
}

static ggml_guid_t nd_guid(void) {
	static ggml_guid guid = {0x6d, 0x66, 0x6e, 0x64, 0x2d, 0x6e, 0x65, 0x74, 0x64, 0x65, 0x76, 0x69, 0x63, 0x65, 0x00, 0x01};
	return &guid;
}

static const struct ggml_backend_i nd_backend_iface = {
	/* get_name           */ nd_backend_name,
	/* free               */ nd_backend_free,
	/* set_tensor_async   */ NULL,
	/* get_tensor_async   */ NULL,
	/* cpy_tensor_async   */ nd_backend_cpy_async,
	/* synchronize        */ nd_backend_synchronize,
	/* graph_plan_create  */ NULL,
	/* graph_plan_free    */ NULL,
	/* graph_plan_update  */ NULL,
	/* graph_plan_compute */ NULL,
	/* graph_compute      */ nd_backend_compute,
	/* event_record       */ NULL,
	/* event_wait         */ NULL,
	/* graph_optimize     */ NULL,
	/* graph_reserve      */ NULL,
	/* buffer_size        */ NULL,
	/* reset              */ NULL,
};

static bool nd_is_backend(ggml_backend_t b) { return b != NULL && ggml_guid_matches(b->guid, nd_guid()); }

static const char *nd_dev_name(ggml_backend_dev_t dev) { return ((nd_device *)dev->context)->name.c_str(); }
static const char *nd_dev_desc(ggml_backend_dev_t dev) { return ((nd_device *)dev->context)->desc.c_str(); }

static void nd_dev_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
	nd_device *d = (nd_device *)dev->context;
	*free = d->info.mem_free;
	*total = d->info.mem_total;
}

static enum ggml_backend_dev_type nd_dev_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_GPU; }

static void nd_dev_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *p) {
	memset(p, 0, sizeof(*p));
	p->name = nd_dev_name(dev);
	p->description = nd_dev_desc(dev);
	p->id = p->name;
	p->library = "macfleet-netdevice";
	nd_dev_memory(dev, &p->memory_free, &p->memory_total);
	p->type = GGML_BACKEND_DEVICE_TYPE_GPU;
}

// Every backend (one per llama context) sends its graphs on a stream of its own; a
// stream freed is reused, and its first graph then replaces the worker's whole copy.
static ggml_backend_t nd_dev_init_backend(ggml_backend_dev_t dev, const char *) {
	nd_device *d = (nd_device *)dev->context;
	std::lock_guard<std::mutex> lock(d->mu);
	uint32_t s = 0;
	while (s < d->streams.size() && d->streams[s]) {
		s++;
	}
	if (s >= MFND_MAX_STREAMS) {
		GGML_LOG_ERROR("%s: more than %u contexts on one split worker\n", d->name.c_str(), MFND_MAX_STREAMS);
		return NULL;
	}
	if (s == d->streams.size()) {
		d->streams.push_back(true);
	}
	d->streams[s] = true;
	return new ggml_backend{nd_guid(), nd_backend_iface, dev, new nd_backend{d, s, {}, {}}};
}

static ggml_backend_buffer_type_t nd_dev_buft(ggml_backend_dev_t dev) { return &((nd_device *)dev->context)->buft; }

// The worker computes with its device's backend of this same build: it supports what
// this process's device of the same kind supports (nd_local_device).
static bool nd_dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op) {
	ggml_backend_dev_t local = ((nd_device *)dev->context)->local;
	return local != NULL && ggml_backend_dev_supports_op(local, op);
}

// Only its own buffers: the worker reads nothing of the runner's memory, so the
// scheduler copies a split's inputs in.
static bool nd_dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) { return buft == nd_dev_buft(dev); }

static const struct ggml_backend_device_i nd_dev_iface = {
	/* get_name             */ nd_dev_name,
	/* get_description      */ nd_dev_desc,
	/* get_memory           */ nd_dev_memory,
	/* get_type             */ nd_dev_type,
	/* get_props            */ nd_dev_props,
	/* init_backend         */ nd_dev_init_backend,
	/* get_buffer_type      */ nd_dev_buft,
	/* get_host_buffer_type */ NULL,
	/* buffer_from_host_ptr */ NULL,
	/* supports_op          */ nd_dev_supports_op,
	/* supports_buft        */ nd_dev_supports_buft,
	/* offload_op           */ NULL,
	/* event_new            */ NULL,
	/* event_free           */ NULL,
	/* event_synchronize    */ NULL,
	/* reset                */ NULL,
};

static const char *nd_reg_name(ggml_backend_reg_t) { return "MFNET"; }
static size_t nd_reg_count(ggml_backend_reg_t) { return 0; }

static const struct ggml_backend_reg_i nd_reg_iface = {
	/* get_name         */ nd_reg_name,
	/* get_device_count */ nd_reg_count,
	/* get_device       */ NULL,
	/* get_proc_address */ NULL,
};

static void nd_seterr(char *err, size_t errlen, const std::string &msg) { snprintf(err, errlen, "%s", msg.c_str()); }

// nd_local_device is this process's device standing for a worker's (mfnd_hello_reply):
// the one of the same name (a worker on Metal, a runner with Metal), else the first of
// the same type, else the CPU (a runner without the worker's kind of device).
static ggml_backend_dev_t nd_local_device(const mfnd_hello_reply &info) {
	ggml_backend_dev_t same_type = NULL;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		ggml_backend_dev_t d = ggml_backend_dev_get(i);
		if ((uint32_t)ggml_backend_dev_type(d) != info.dev_type) {
			continue;
		}
		if (strncmp(ggml_backend_dev_name(d), info.dev_name, sizeof(info.dev_name)) == 0) {
			return d;
		}
		if (same_type == NULL) {
			same_type = d;
		}
	}
	return same_type != NULL ? same_type : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

extern "C" void *mfnd_open(int fd, const char *addr, int index, const char *model_path, int timeout_ms, const uint8_t *session,
                           char *err, size_t errlen) {
	mfnd_hello h;
	memset(&h, 0, sizeof(h));
	h.magic = MFND_MAGIC;
	h.version = MFND_VERSION;
	h.ptr_size = (uint32_t)sizeof(void *);
	h.endian = 0x01020304u;
	memcpy(h.session, session, sizeof(h.session));
	h.timeout_ms = (uint32_t)timeout_ms;
	std::string e = mfnd_file_identity(model_path, &h.file_size, &h.header_hash);
	if (!e.empty()) {
		close(fd);
		nd_seterr(err, errlen, e);
		return NULL;
	}
	mfnd_socket_options(fd, timeout_ms);
	nd_device *d = new nd_device;
	d->fd = fd;
	d->addr = addr;
	d->name = "NET" + std::to_string(index);
	d->desc = std::string("split worker at ") + addr;
	d->buft_name = d->name;
	d->reg = {GGML_BACKEND_API_VERSION, nd_reg_iface, d};
	d->dev = {nd_dev_iface, &d->reg, d};
	d->buft = {nd_buft_iface, &d->dev, d, false};
	std::vector<uint8_t> reply;
	bool ok = nd_call(d, MFND_HELLO, &h, sizeof(h), reply);
	uint32_t version = 0;
	if (ok && reply.size() >= sizeof(version)) {
		memcpy(&version, reply.data(), sizeof(version));
	}
	if (!ok || version != MFND_VERSION || reply.size() != sizeof(mfnd_hello_reply)) {
		std::string e = d->err;
		if (e.empty() && version != MFND_VERSION) {
			e = "split worker " + std::string(addr) + ": the worker speaks protocol version " + std::to_string(version) +
			    ", this runner " + std::to_string(MFND_VERSION) + ": run the same build on both";
		} else if (e.empty()) {
			e = "split worker " + std::string(addr) + ": a malformed greeting";
		}
		nd_seterr(err, errlen, e);
		nd_fail(d, "closed");
		delete d;
		return NULL;
	}
	memcpy(&d->info, reply.data(), sizeof(d->info));
	d->info.dev_name[sizeof(d->info.dev_name) - 1] = 0;
	d->local = nd_local_device(d->info);
	if (d->local == NULL) {
		nd_seterr(err, errlen, "split worker " + std::string(addr) + ": this runner has no CPU device");
		nd_fail(d, "closed");
		delete d;
		return NULL;
	}
	memcpy(d->session, session, sizeof(d->session));
	d->has_next = d->info.has_next != 0;
	if (d->info.threads > 0 && d->info.dev_type == GGML_BACKEND_DEVICE_TYPE_CPU) {
		d->desc += std::string(" (") + d->info.dev_name + ", " + std::to_string(d->info.threads) + " threads)";
	} else {
		d->desc += std::string(" (") + d->info.dev_name + ")";
	}
	return &d->dev;
}

extern "C" void mfnd_device_info(void *dev, int *type, char *name, size_t namelen) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	*type = (int)d->info.dev_type;
	snprintf(name, namelen, "%s", d->info.dev_name);
}

extern "C" int mfnd_has_next(void *dev) { return ((nd_device *)((ggml_backend_dev_t)dev)->context)->has_next ? 1 : 0; }

extern "C" int mfnd_peer(void *dev, void *next_dev, char *err, size_t errlen) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	nd_device *next = (nd_device *)((ggml_backend_dev_t)next_dev)->context;
	mfnd_peer_req p;
	memcpy(p.session, next->session, sizeof(p.session));
	std::vector<uint8_t> reply;
	std::lock_guard<std::mutex> lock(d->mu);
	if (!nd_call(d, MFND_PEER, &p, sizeof(p), reply)) {
		nd_seterr(err, errlen, d->err.empty() ? "split worker " + d->addr + ": not asked: another split worker's link failed" : d->err);
		return -1;
	}
	d->next = next;
	return 0;
}

extern "C" int mfnd_check(void *dev, char *err, size_t errlen) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	std::vector<uint8_t> reply;
	std::lock_guard<std::mutex> lock(d->mu);
	if (nd_call(d, MFND_STATUS, NULL, 0, reply)) {
		return 0;
	}
	nd_seterr(err, errlen, d->err.empty() ? "split worker " + d->addr + ": not asked: another split worker's link failed" : d->err);
	return -1;
}

extern "C" int mfnd_keepalive(void *dev) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	int every = (int)(d->info.idle_ms / 3);
	std::unique_lock<std::mutex> lock(d->mu, std::try_to_lock);
	// A link in use, or with frames queued or answers pending, is not idle: the thread
	// using it sends soon enough.
	if (every == 0 || !lock.owns_lock() || !d->err.empty() || !d->out.empty() || !d->pending.empty() ||
	    std::chrono::steady_clock::now() - d->last_sent < std::chrono::milliseconds(every)) {
		return every;
	}
	std::vector<uint8_t> reply;
	nd_call(d, MFND_STATUS, NULL, 0, reply); // a failure fails the link, which its next command reports
	return every;
}

extern "C" int mfnd_error(void *dev, char *err, size_t errlen) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	std::lock_guard<std::mutex> lock(d->smu);
	if (d->err.empty()) {
		return 0;
	}
	nd_seterr(err, errlen, d->err);
	return -1;
}

extern "C" void mfnd_get_stats(void *dev, mfnd_stats *s) {
	nd_device *d = (nd_device *)((ggml_backend_dev_t)dev)->context;
	std::lock_guard<std::mutex> lock(d->smu);
	*s = {d->sent, d->received, d->round_trips, d->computes, d->wait_ns, d->compute_ns, d->allocated, d->info.mem_total,
	      d->peer_sent, d->next != NULL ? 1u : 0u};
}

extern "C" void mfnd_get_thread_stats(mfnd_thread_stats *s) { *s = nd_thread; }
