// The wire protocol between a runner's network device (client.cpp) and a worker
// (worker.cpp); docs/split-model.md describes it. Both ends are this same source, so
// the protocol is versioned for safety, not for compatibility across builds.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "ggml.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 // darwin: SO_NOSIGPIPE is set on the socket instead
#endif

#define MFND_MAGIC 0x444e464du // "MFND"
#define MFND_VERSION 7u

// Commands. Those marked "answered" wait for the worker's reply; the others are
// queued and their errors are reported by the next answered command.
enum mfnd_cmd : uint8_t {
	MFND_HELLO = 1,     // answered: protocol and model identity
	MFND_ALLOC = 2,     // answered: a buffer of the worker's memory
	MFND_FREE = 3,      // frees a buffer
	MFND_CLEAR = 4,     // fills a whole buffer with a byte
	MFND_SET = 5,       // writes bytes sent along
	MFND_SET_FILE = 6,  // writes a weight from the worker's own model file, checked
	MFND_GET = 7,       // answered: reads bytes
	MFND_COPY = 8,      // copies within the worker's memory
	MFND_MEMSET = 9,    // fills a range with a byte
	MFND_COMPUTE = 10,  // answered: computes a graph; the answer is the compute time (u64 ns), the bytes pushed to the next worker so far (u64) and, unless pushed, its last node's bytes
	MFND_STATUS = 11,   // answered: the first queued error, if any
	MFND_PEER = 12,     // answered: dial the --next worker and greet it with its session id (mfnd_peer_req)
	MFND_AWAIT = 13,    // reads the previous worker's push of a sequence number into the worker's memory (mfnd_await)
	// The first frame of a peer connection, from the previous worker: the next worker's
	// session id (16 bytes); answered with 0 (accepted) or 1 and the reason.
	MFND_PEER_HELLO = 14,
	MFND_PUSH = 15, // pushes bytes of the worker's memory to the next worker (mfnd_push)
};

// Frame: u32 payload length, u8 command (request) or status (reply: 0 ok, 1 error,
// the payload then being the message), payload.
#define MFND_HEADER 5u
// The worker's bounds on what a runner (or a previous worker) may send it: a frame
// before the greeting (a greeting is 56 bytes; another version's may be a little
// larger), any frame after it (the largest SET, GET or push carries at most
// MFND_MAX_TRANSFER bytes), a graph's tensors and nodes, its graph streams' tensors
// together, its buffers and the pushes it keeps while awaiting another (the stash).
#define MFND_MAX_GREETING_FRAME 4096u
#define MFND_MAX_TRANSFER (1u << 30)
#define MFND_MAX_FRAME (MFND_MAX_TRANSFER + 64u)
#define MFND_MAX_GRAPH_TENSORS (1u << 18)
#define MFND_MAX_HELD_TENSORS (1u << 20)
#define MFND_MAX_BUFFERS 65536u
#define MFND_MAX_STASH 64u
// A connection must greet the worker within this time.
#define MFND_GREETING_MS 10000
// COMPUTE is answered with the bytes of the graph's last node up to this size.
#define MFND_MAX_OUTPUT (64u << 20)
// The longest device name a worker reports, terminator included.
#define MFND_DEVICE_NAME 64u

struct mfnd_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t ptr_size;   // both ends must agree on pointer width and byte order
	uint32_t endian;     // 0x01020304 as written by the sender
	uint64_t file_size;  // the model file's size
	uint64_t header_hash; // hash of the file's GGUF header (metadata and tensor table)
	// A random id the runner gives this worker's session: the previous worker's peer
	// connection must present it (MFND_PEER_HELLO).
	uint8_t session[16];
	uint32_t timeout_ms; // the runner's split timeout: bounds every wait on a peer link
	uint32_t pad;
};

// The worker's answer to HELLO: its memory, and the ggml device it computes with
// (its type, e.g. CPU or GPU, and name, e.g. "CPU" or "Metal"; the runner answers for
// the device what its own device of that type answers) with its buffer type's
// alignment and largest buffer.
struct mfnd_hello_reply {
	uint32_t version;
	uint32_t threads; // the worker's compute threads (for logs; a CPU device uses them)
	uint64_t mem_free;
	uint64_t mem_total;
	uint32_t dev_type; // enum ggml_backend_dev_type
	uint32_t has_next; // started with --next: it can push to the next shard's worker
	uint64_t alignment;
	uint64_t max_size;
	// The worker ends a session after this long without a command (0: never); the
	// runner's device sends a STATUS when its link has been idle a third of it.
	uint32_t idle_ms;
	uint32_t pad;
	char dev_name[MFND_DEVICE_NAME];
};

// MFND_PEER (mfnd_peer_req): the next worker's session id, which the worker presents to it.
struct mfnd_peer_req {
	uint8_t session[16];
};

// MFND_AWAIT: write the push of seq (from the previous worker, on the peer connection)
// at addr; its size must be size. The next worker takes addresses from its own runner
// only: a push carries a sequence number and bytes.
struct mfnd_await {
	uint64_t seq;
	uint64_t addr;
	uint64_t size;
};

// MFND_PUSH: push [addr, addr+size) to the next worker as seq. A COMPUTE pushes its
// last node itself (MFND_GRAPH_PUSH); this is for any other tensor the next worker's
// layers read (a prefill graph's first worker has two such outputs).
struct mfnd_push {
	uint64_t seq;
	uint64_t addr;
	uint64_t size;
};

// A push on a peer connection: the frame header (u32 length, u8 0 ok or 1 error), the
// sequence number (u64), then the bytes, or the message of the error that kept the
// previous worker from computing them.

struct mfnd_set_file {
	uint64_t addr;
	uint64_t offset; // within the tensor
	uint64_t size;
	uint64_t hash;
	char name[GGML_MAX_NAME];
};

// One tensor of a graph to compute. Pointers (id, src, view_src) are the runner's
// tensor addresses, used as references within the message; data is the worker's
// address the runner's allocator placed the tensor at.
struct mfnd_tensor {
	uint64_t id;
	int32_t type;
	int32_t op;
	int32_t flags;
	int32_t pad;
	int64_t ne[GGML_MAX_DIMS];
	uint64_t nb[GGML_MAX_DIMS];
	int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)];
	uint64_t src[GGML_MAX_SRC];
	uint64_t view_src;
	uint64_t view_offs;
	uint64_t data;
};

// A graph to compute: mfnd_graph, then n_changed pairs (u32 index, mfnd_tensor) that
// replace or append to the worker's copy of the previous graph of the same stream's
// tensor list (cut to n_tensors), then, when nodes_sent, n_nodes u32 indexes into that
// list (else that previous graph's nodes). A stream is one of the runner's backends on
// the device (one per llama context): each context's graphs repeat its own previous
// ones.
struct mfnd_graph {
	uint32_t n_tensors;
	uint32_t n_nodes;
	uint32_t n_changed;
	uint32_t nodes_sent;
	uint32_t stream; // below MFND_MAX_STREAMS
	// MFND_GRAPH_PUSH: after computing, push the last node's bytes to the next worker as
	// push_seq (and answer without them). The runner sets it on a queued COMPUTE when
	// ggml asks to copy that node to the next worker's device (client_backend.cpp).
	uint32_t flags;
	uint64_t push_seq;
};

#define MFND_GRAPH_PUSH 1u

#define MFND_MAX_STREAMS 64u

// mfnd_hash is a fast 64-bit hash for telling two copies of a file apart (not a
// cryptographic digest).
static inline uint64_t mfnd_hash(const void *p, size_t n) {
	const uint8_t *b = (const uint8_t *)p;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, b + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 31;
	}
	for (; i < n; i++) {
		h = (h ^ b[i]) * 0x100000001b3ull;
	}
	h ^= h >> 29;
	return h * 0xbf58476d1ce4e5b9ull;
}

// mfnd_file_identity reads a GGUF file's size and the hash of its header (everything
// before the tensor data). It returns an error message, empty on success.
std::string mfnd_file_identity(const char *path, uint64_t *size, uint64_t *header_hash);

// Socket helpers shared by both ends: whole writes and reads, false on error or EOF
// (a read timeout set with SO_RCVTIMEO ends a read with an error too).
bool mfnd_write_all(int fd, const void *p, size_t n);
// mfnd_socket_options sets a link's options: no Nagle delay, keepalive, no SIGPIPE,
// and with timeout_ms > 0 a timeout on every read and write.
void mfnd_socket_options(int fd, int timeout_ms);
bool mfnd_read_all(int fd, void *p, size_t n);
// mfnd_socket_timeouts sets (timeout_ms > 0) or clears (0) a link's read and write
// timeouts.
void mfnd_socket_timeouts(int fd, int timeout_ms);
// mfnd_dial connects to HOST:PORT within timeout_ms; it returns the socket, or -1
// with a message in err.
int mfnd_dial(const std::string &addr, int timeout_ms, std::string &err);
// mfnd_peek_command waits up to timeout_ms for a connection's first frame header and
// returns its command without consuming it, or -1.
int mfnd_peek_command(int fd, int timeout_ms);

// mfnd_read_frame reads one frame of at most max payload bytes into payload (growing it
// as the bytes arrive, so a frame that claims more than is sent costs no more than
// what was sent) and its command or status into cmd. It returns "" on success, else
// why not: MFND_EOF for a link closed before a frame, "timeout" for a read timeout
// (SO_RCVTIMEO), or a message.
#define MFND_EOF "eof"
#define MFND_TIMEOUT "timeout"
std::string mfnd_read_frame(int fd, uint32_t max, uint8_t *cmd, std::vector<uint8_t> &payload);

// mfnd_put appends a value's bytes to a frame under construction.
template <typename T> static inline void mfnd_put(std::vector<uint8_t> &v, const T &x) {
	const uint8_t *p = (const uint8_t *)&x;
	v.insert(v.end(), p, p + sizeof(T));
}
