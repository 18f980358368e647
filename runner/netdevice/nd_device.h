// The runner-side state of one network device, shared by client.cpp (the link and the
// buffers) and client_backend.cpp (the backend and the device).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "../src/ggml-backend-impl.h"
#include "netdevice.h"
#include "wire.h"

// The last node's bytes of a graph one backend computed (see nd_device.outs).
struct nd_output {
	const void *owner; // the ggml_backend_t that computed it
	uint64_t addr;
	std::vector<uint8_t> bytes;
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
	// The graph streams (wire.h, mfnd_graph) the backends hold (under mu).
	std::vector<bool> streams;
	// The bytes of the last graph's last node, which the worker answers COMPUTE with,
	// one per backend: the next split almost always reads exactly that (the hidden
	// state after the worker's layers), and reading it from here saves a round trip.
	// A backend's next compute replaces its entry; a command writing the worker's
	// memory drops the entries it overlaps (a context's graphs write only its own
	// buffers, so another context's compute leaves them valid).
	std::vector<nd_output> outs;
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
};

// nd_thread is the calling thread's share of the links' counters (netdevice.h,
// mfnd_thread_stats).
extern thread_local mfnd_thread_stats nd_thread;

// nd_lock takes d->mu for a command, counting the wait in nd_thread.queue_ns.
std::unique_lock<std::mutex> nd_lock(nd_device *d);

// The link (client.cpp); callers hold d->mu.
void nd_fail(nd_device *d, const std::string &msg);
void nd_queue(nd_device *d, uint8_t cmd, const void *p, size_t n, const void *extra = NULL, size_t extra_n = 0);
bool nd_flush(nd_device *d);
bool nd_call(nd_device *d, uint8_t cmd, const void *p, size_t n, std::vector<uint8_t> &reply);
// nd_drop_outputs forgets the computed outputs overlapping [addr, addr+size).
void nd_drop_outputs(nd_device *d, uint64_t addr, uint64_t size);

extern const struct ggml_backend_buffer_type_i nd_buft_iface;
