// The C interface of the network device (client.cpp) and the worker (worker.cpp) to
// Go. The Go side dials and accepts; these functions take the connected socket.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfnd_stats {
	uint64_t sent, received, round_trips, computes, wait_ns, compute_ns, allocated, memory;
	// peer_sent: the bytes the worker pushed to the next shard's worker (framing
	// included), as it reported them; peer: its peer link to it is up.
	uint64_t peer_sent;
	uint32_t peer;
} mfnd_stats;

// mfnd_open greets the worker on the connected socket fd (which it then owns), giving
// its session the 16-byte id session, and returns the device (a ggml_backend_dev_t),
// or NULL with a message in err.
void *mfnd_open(int fd, const char *addr, int index, const char *model_path, int timeout_ms, const uint8_t *session,
                char *err, size_t errlen);
// mfnd_has_next says whether the worker was started with --next.
int mfnd_has_next(void *dev);
// mfnd_peer asks the worker to open its peer link to the worker of next_dev (the next
// shard's): 0, or -1 with the message in err (the link is then failed).
int mfnd_peer(void *dev, void *next_dev, char *err, size_t errlen);
// mfnd_check asks the worker for its first queued error (a weight whose bytes differ,
// a bad address); it returns 0 when all is well, else -1 with the message in err.
int mfnd_check(void *dev, char *err, size_t errlen);
// mfnd_keepalive sends a STATUS when the link has been idle a third of the worker's
// idle timeout and no other thread is using it; it returns the interval at which to
// call it in milliseconds (0: the worker never idles a session out).
int mfnd_keepalive(void *dev);
// mfnd_error returns -1 with the message in err once the link has failed, else 0.
int mfnd_error(void *dev, char *err, size_t errlen);
void mfnd_get_stats(void *dev, mfnd_stats *s);

// What the calling thread's commands cost so far, on every device (a split runner's
// engine keeps to one thread): queue_ns is the time it waited for another thread's
// command to leave a link free (a pipelined runner's other context).
typedef struct mfnd_thread_stats {
	uint64_t sent, received, round_trips, computes, wait_ns, compute_ns, queue_ns;
} mfnd_thread_stats;
void mfnd_get_thread_stats(mfnd_thread_stats *s);

// mfnd_device_info gives the device a runner's network device's worker computes with,
// as the worker answered the greeting: its type (enum ggml_backend_dev_type) and name.
void mfnd_device_info(void *dev, int *type, char *name, size_t namelen);

// The device a worker computes with: the first GPU ggml registered, else the CPU
// (auto), or the one asked for.
enum { MFND_DEVICE_AUTO = 0, MFND_DEVICE_CPU = 1, MFND_DEVICE_GPU = 2 };

// mfnd_worker_device gives the device a worker would compute with for choice (one of
// the above): its type (enum ggml_backend_dev_type) and name; -1 with a message in err
// when there is none (a GPU asked for on a host without one).
int mfnd_worker_device(int choice, int *type, char *name, size_t namelen, char *err, size_t errlen);

// mfnd_serve serves one runner on the connected socket fd until it disconnects; it
// returns 0 then, or -1 with a message in err when the session failed. The worker
// computes with choice's device (mfnd_worker_device), with threads threads when that
// is the CPU. memory is what the worker answers the runner as its free and total
// memory (0: the device's). next is --next, the address of the next shard's worker
// ("" or NULL: none). idle_ms ends the session after that long without a command (0:
// never); the runner's device keeps an idle link alive (mfnd_keepalive).
int mfnd_serve(int fd, const char *model_path, int choice, int threads, uint64_t memory, const char *next, int idle_ms,
               char *err, size_t errlen);
// mfnd_peek returns the command of a new connection's first frame without reading it
// (MFND_PEER_HELLO, 14, for a previous worker's peer link), or -1 when none comes
// within timeout_ms.
int mfnd_peek(int fd, int timeout_ms);
// mfnd_peer_hello returns the command of a peer link's first frame (MFND_PEER_HELLO)
// and gives the size of the session id it carries.
int mfnd_peer_hello(int *session_bytes);
// mfnd_peer_accept takes a peer link (it owns fd): it joins the session being served
// when it presents that session's id; else it is refused and closed, -1 with the
// reason in err.
int mfnd_peer_accept(int fd, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
