// The worker's peer links (docs/split-model.md, "Worker to worker"): a worker started
// with --next dials the next shard's worker when its runner asks (MFND_PEER) and
// pushes the hidden state after its layers straight to it (a COMPUTE with
// MFND_GRAPH_PUSH); the next worker reads it when its own runner asks (MFND_AWAIT).
// A peer link is accepted only with the session id of the runner the worker serves.

#include "netdevice.h"
#include "worker.h"

#include <errno.h>
#include <sys/socket.h>

#include <mutex>

// The session being served (one runner at a time), which a previous worker's peer
// link joins; nd_peer_mu guards it and its peer_in.
static std::mutex nd_peer_mu;
static nd_worker *nd_current = NULL;

void nd_worker::begin_session(const uint8_t id[16], int timeout) {
	std::lock_guard<std::mutex> lock(nd_peer_mu);
	memcpy(session, id, sizeof(session));
	timeout_ms = timeout;
	nd_current = this;
}

void nd_worker::end_session() {
	std::lock_guard<std::mutex> lock(nd_peer_mu);
	if (nd_current == this) {
		nd_current = NULL;
	}
	if (peer_in >= 0) {
		close(peer_in);
		peer_in = -1;
	}
	if (peer_out >= 0) {
		close(peer_out);
		peer_out = -1;
	}
}

// nd_read_frame reads one frame of at most max bytes: false when the link fails
// (errno EAGAIN at a timeout).
static bool nd_read_frame(int fd, uint32_t max, uint8_t *status, std::vector<uint8_t> &payload) {
	std::string r = mfnd_read_frame(fd, max, status, payload);
	if (r == MFND_TIMEOUT) {
		errno = EAGAIN;
	} else if (!r.empty()) {
		errno = EPROTO;
	}
	return r.empty();
}

static bool nd_write_frame(int fd, uint8_t status, const void *a, size_t an, const void *b, size_t bn) {
	uint8_t head[MFND_HEADER];
	uint32_t len = (uint32_t)(an + bn);
	memcpy(head, &len, 4);
	head[4] = status;
	return mfnd_write_all(fd, head, sizeof(head)) && (an == 0 || mfnd_write_all(fd, a, an)) &&
	       (bn == 0 || mfnd_write_all(fd, b, bn));
}

// peer serves MFND_PEER: it dials --next and greets it with the next worker's session
// id. A failure is answered, not kept: the runner's load fails with it.
bool nd_worker::peer() {
	std::string e;
	if (msg.size() != sizeof(mfnd_peer_req)) {
		e = "malformed peer request";
	} else if (next.empty()) {
		e = "this worker was started without --next";
	}
	if (peer_out >= 0) {
		close(peer_out);
		peer_out = -1;
	}
	int fd = e.empty() ? mfnd_dial(next, timeout_ms, e) : -1;
	if (fd >= 0) {
		uint8_t status = 1;
		std::vector<uint8_t> r;
		if (!nd_write_frame(fd, MFND_PEER_HELLO, msg.data(), msg.size(), NULL, 0) || !nd_read_frame(fd, MFND_MAX_GREETING_FRAME, &status, r)) {
			e = std::string("the link was lost during the greeting (") + strerror(errno) + ")";
		} else if (status != 0) {
			e = "it refused the peer link: " + std::string(r.begin(), r.end());
		}
		if (!e.empty()) {
			close(fd);
			fd = -1;
		}
	}
	if (fd < 0) {
		e = "the next worker at " + next + " (--next): " + e;
		return reply(1, e.data(), e.size());
	}
	peer_out = fd;
	return answer(NULL, 0);
}

// push sends the bytes of sequence number seq to the next worker; with p NULL and n 0
// while the worker has an error, it sends the error, so that the next worker's await
// fails at once instead of at its timeout.
void nd_worker::push(uint64_t seq, const void *p, size_t n) {
	if (peer_out < 0) {
		fail("a push without a link to the next worker (--next)");
		return;
	}
	bool ok = err.empty();
	std::vector<uint8_t> head(sizeof(seq));
	memcpy(head.data(), &seq, sizeof(seq));
	if (!ok) {
		p = err.data();
		n = err.size();
	}
	if (!nd_write_frame(peer_out, ok ? 0 : 1, head.data(), head.size(), p, n)) {
		fail("pushing to the next worker at " + next + ": the link is lost (" + strerror(errno) + ")");
		close(peer_out);
		peer_out = -1;
		return;
	}
	pushed += MFND_HEADER + sizeof(seq) + n;
}

// await serves MFND_AWAIT: it reads pushes from the previous worker until seq's (a
// pipelined runner's contexts may have their pushes and awaits in different orders on
// the two workers: the others wait in stash) and writes it at the address the runner
// gave.
void nd_worker::await() {
	mfnd_await a;
	if (msg.size() != sizeof(a)) {
		fail("malformed await");
		return;
	}
	memcpy(&a, msg.data(), sizeof(a));
	if (a.size > MFND_MAX_TRANSFER) {
		fail("an await of " + std::to_string(a.size) + " bytes, above the worker's " + std::to_string(MFND_MAX_TRANSFER));
		return;
	}
	ggml_backend_buffer_t dst = mem(a.addr, a.size, "await");
	if (dst == NULL || !err.empty()) {
		return;
	}
	int fd;
	{
		std::lock_guard<std::mutex> lock(nd_peer_mu);
		fd = peer_in;
	}
	for (;;) {
		auto it = stash.find(a.seq);
		if (it != stash.end()) {
			if (!it->second.ok) {
				fail("the previous worker failed: " + std::string(it->second.bytes.begin(), it->second.bytes.end()));
			} else if (it->second.bytes.size() != a.size) {
				fail("a push of " + std::to_string(it->second.bytes.size()) + " bytes where " + std::to_string(a.size) +
				     " were awaited");
			} else {
				mfnd_range_set(dst, a.addr, it->second.bytes.data(), a.size);
			}
			stashed -= std::min(stashed, (uint64_t)it->second.bytes.size());
			stash.erase(it);
			return;
		}
		if (fd < 0) {
			fail("an await without a link from the previous worker");
			return;
		}
		uint8_t status = 1;
		std::vector<uint8_t> f;
		if (stash.size() >= MFND_MAX_STASH || stashed > MFND_MAX_TRANSFER) {
			fail("the previous worker pushed " + std::to_string(stash.size()) + " sequence numbers (" + std::to_string(stashed) +
			     " bytes) no await asked for, the worker's most");
			return;
		}
		if (!nd_read_frame(fd, MFND_MAX_TRANSFER + sizeof(uint64_t), &status, f) || f.size() < sizeof(uint64_t)) {
			bool timeout = errno == EAGAIN || errno == EWOULDBLOCK;
			fail(timeout ? "no push from the previous worker within the split timeout"
			             : "the link from the previous worker is lost (it closed it or died)");
			return;
		}
		uint64_t seq;
		memcpy(&seq, f.data(), sizeof(seq));
		peer_push &slot = stash[seq];
		stashed -= std::min(stashed, (uint64_t)slot.bytes.size());
		slot = {status == 0, std::vector<uint8_t>(f.begin() + sizeof(seq), f.end())};
		stashed += slot.bytes.size();
	}
}

extern "C" int mfnd_peek(int fd, int timeout_ms) { return mfnd_peek_command(fd, timeout_ms); }

extern "C" int mfnd_peer_hello(int *session_bytes) {
	*session_bytes = (int)sizeof(mfnd_peer_req::session);
	return MFND_PEER_HELLO;
}

extern "C" int mfnd_peer_accept(int fd, char *err, size_t errlen) {
	mfnd_socket_options(fd, 10000); // the greeting comes at once
	uint8_t status = 0;
	std::vector<uint8_t> p;
	std::string e;
	bool refused = true; // told to the previous worker
	if (!nd_read_frame(fd, MFND_MAX_GREETING_FRAME, &status, p)) {
		refused = false;
		e = "the link was lost before its greeting";
	} else if (status != MFND_PEER_HELLO || p.size() != sizeof(mfnd_peer_req)) {
		e = "a malformed peer greeting";
		refused = false;
	} else {
		std::lock_guard<std::mutex> lock(nd_peer_mu);
		if (nd_current == NULL) {
			e = "this worker serves no runner";
		} else if (memcmp(nd_current->session, p.data(), sizeof(nd_current->session)) != 0) {
			e = "its session id is not the one this worker's runner gave it "
			    "(the previous worker's --next reaches a worker of another runner)";
		} else if (nd_current->peer_in >= 0) {
			e = "this worker's session already has one";
		} else if (nd_write_frame(fd, 0, NULL, 0, NULL, 0)) {
			mfnd_socket_options(fd, nd_current->timeout_ms);
			nd_current->peer_in = fd;
			return 0;
		} else {
			e = "the link was lost while accepting it";
			refused = false;
		}
	}
	if (refused) {
		nd_write_frame(fd, 1, e.data(), e.size(), NULL, 0);
	}
	close(fd);
	snprintf(err, errlen, "%s%s", refused ? "refused: " : "", e.c_str());
	return -1;
}
