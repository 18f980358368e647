// The runner-side state of one network device, shared by client.cpp (the link and the
// buffers) and client_backend.cpp (the backend and the device).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "../src/ggml-backend-impl.h"
#include "netdevice.h"
#include "wire.h"

struct nd_backend;

// The last node's bytes of a graph one backend computed (see nd_device.outs).
struct nd_output {
	const nd_backend *owner; // the backend that computed it
	uint64_t addr;
	std::vector<uint8_t> bytes;
};

// A COMPUTE sent (or queued) whose answer has not been read yet. Answers come in the
// order of the commands, so every read of an answer first reads the pending ones.
struct nd_pending {
	nd_backend *owner;
	uint64_t addr; // the last node's address and size, whose bytes the answer carries
	size_t size;
	bool pushed;   // unless its last node is pushed to the next worker
};

// Several llama contexts may use one device at once (a pipelined split runner,
// docs/split-model.md), each from its own thread with its own backend: mu serializes
// the link, and smu, taken briefly, guards what a context reads while another one
// waits on the worker (the link's failure, the counters, the computed outputs). Lock
// order: mu, then smu.
struct nd_device {
	std::string addr, name, desc, buft_name;
	int fd = -1;
	std::mutex mu; // guards the link and the graph below: the scheduler and buffer frees may run on different threads
	std::mutex smu; // guards err, the counters and outs
	std::string err; // sticky: once set, the link is gone and every call fails fast (written under mu and smu)
	std::vector<uint8_t> out; // queued frames, flushed before every answered command
	mfnd_hello_reply info = {};
	// local is this process's device of the worker's kind (nd_local_device): the same
	// build computes there with the same backend, so it answers for the worker which
	// operations it supports and how much memory a tensor takes in its buffers.
	ggml_backend_dev_t local = NULL;
	uint64_t sent = 0, received = 0, round_trips = 0, computes = 0;
	// wait_ns: time spent in answered commands (sending, the worker's work, the
	// answer); compute_ns: the part the worker spent computing graphs, as it reports.
	uint64_t wait_ns = 0, compute_ns = 0;
	uint64_t allocated = 0; // bytes of the worker's buffers this runner holds
	// When the link last carried a frame to the worker (under mu): the worker ends a
	// session idle for info.idle_ms, so mfnd_keepalive sends a STATUS before that.
	std::chrono::steady_clock::time_point last_sent = std::chrono::steady_clock::now();
	// The graph streams (wire.h, mfnd_graph) the backends hold (under mu).
	std::vector<bool> streams;
	// The bytes of the last graph's last node, which the worker answers COMPUTE with,
	// one per backend: the next split almost always reads exactly that (the hidden
	// state after the worker's layers), and reading it from here saves a round trip.
	// A backend's next compute replaces its entry; a command writing the worker's
	// memory drops the entries it overlaps (a context's graphs write only its own
	// buffers, so another context's compute leaves them valid).
	std::vector<nd_output> outs;
	// Asynchronous computes (client_backend.cpp): graph_compute queues COMPUTE and
	// returns; its answer is read by synchronize or before any later answer. gen counts
	// the flushes, so that a backend can tell its queued COMPUTE from a sent one.
	std::deque<nd_pending> pending;
	uint64_t gen = 0;
	// Worker to worker: session is the id given to this worker at the greeting;
	// has_next says it was started with --next; next is the device of the next shard's
	// worker once the peer link is up (mfnd_peer), push_seq the last sequence number of
	// a push from this worker; peer_sent the bytes it pushed, as it reports them.
	uint8_t session[16] = {0};
	bool has_next = false;
	nd_device *next = NULL;
	uint64_t push_seq = 0;
	uint64_t peer_sent = 0;
	struct ggml_backend_buffer_type buft;
	struct ggml_backend_device dev;
	struct ggml_backend_reg reg;
};

// One backend of the device (a llama context's): its graph stream, and the last graph
// it sent on it, which the worker holds too. The next one is sent as the records that
// changed (a decode step's graph mostly repeats the same context's previous one).
struct nd_backend {
	nd_device *d;
	uint32_t stream;
	std::vector<mfnd_tensor> last_tensors;
	std::vector<uint32_t> last_nodes;
	// The queued COMPUTE (while d->gen is still queued_gen): where its mfnd_graph is in
	// d->out, so that a copy of its last node to the next worker can turn it into a push.
	bool queued = false;
	uint64_t queued_gen = 0;
	size_t queued_at = 0;
	// What its COMPUTEs' answers cost when another thread (a pipelined runner's other
	// context) read them: its own thread adds it to its counters at its next compute
	// or synchronize (under d->smu), so that each context counts its own graphs.
	mfnd_thread_stats owed = {};
};

// nd_thread is the calling thread's share of the links' counters (netdevice.h,
// mfnd_thread_stats).
extern thread_local mfnd_thread_stats nd_thread;

// nd_link_failed is set once any device's link has failed (client.cpp).
extern std::atomic<bool> nd_link_failed;

// nd_lock takes d->mu for a command, counting the wait in nd_thread.queue_ns.
std::unique_lock<std::mutex> nd_lock(nd_device *d);

// The link (client.cpp); callers hold d->mu.
void nd_fail(nd_device *d, const std::string &msg);
void nd_queue(nd_device *d, uint8_t cmd, const void *p, size_t n, const void *extra = NULL, size_t extra_n = 0);
bool nd_flush(nd_device *d);
bool nd_call(nd_device *d, uint8_t cmd, const void *p, size_t n, std::vector<uint8_t> &reply);
// nd_drain sends what is queued and reads the pending answers: all of them, or with
// owner set until none of owner's is left. False once the link has failed.
bool nd_drain(nd_device *d, nd_backend *owner);
// nd_drop_outputs forgets the computed outputs overlapping [addr, addr+size).
void nd_drop_outputs(nd_device *d, uint64_t addr, uint64_t size);
// nd_collect adds what b's answers cost when read by another thread to the calling
// thread's counters (b's own thread calls it).
void nd_collect(nd_backend *b);

extern const struct ggml_backend_buffer_type_i nd_buft_iface;
