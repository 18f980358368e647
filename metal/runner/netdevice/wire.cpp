// Helpers shared by the network device and the worker: the model file's identity and
// whole reads and writes on a socket.

#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "gguf.h"

std::string mfnd_file_identity(const char *path, uint64_t *size, uint64_t *header_hash) {
	struct stat st;
	if (stat(path, &st) != 0) {
		return std::string("cannot stat ") + path + ": " + strerror(errno);
	}
	struct gguf_init_params gp = {/*no_alloc*/ true, /*ctx*/ NULL};
	struct gguf_context *g = gguf_init_from_file(path, gp);
	if (g == NULL) {
		return std::string(path) + " is not a readable GGUF file";
	}
	size_t n = gguf_get_data_offset(g);
	gguf_free(g);
	std::vector<uint8_t> head(n);
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		return std::string("cannot open ") + path + ": " + strerror(errno);
	}
	ssize_t got = pread(fd, head.data(), n, 0);
	close(fd);
	if (got != (ssize_t)n) {
		return std::string("cannot read the header of ") + path;
	}
	*size = (uint64_t)st.st_size;
	*header_hash = mfnd_hash(head.data(), n);
	return "";
}

void mfnd_socket_timeouts(int fd, int timeout_ms) {
	int ms = timeout_ms > 0 ? timeout_ms : 0;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void mfnd_socket_options(int fd, int timeout_ms) {
	if (timeout_ms > 0) {
		mfnd_socket_timeouts(fd, timeout_ms);
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
	setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
}

#ifdef SOCK_CLOEXEC
#define SOCK_CLOEXEC_IF_ANY SOCK_CLOEXEC
#else
#define SOCK_CLOEXEC_IF_ANY 0
#endif

// mfnd_io moves n bytes whole, in one direction.
static bool mfnd_io(int fd, char *b, size_t n, bool out) {
	while (n > 0) {
		ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k <= 0) {
			return false;
		}
		b += k;
		n -= (size_t)k;
	}
	return true;
}

bool mfnd_write_all(int fd, const void *p, size_t n) { return mfnd_io(fd, (char *)p, n, true); }

bool mfnd_read_all(int fd, void *p, size_t n) { return mfnd_io(fd, (char *)p, n, false); }

int mfnd_dial(const std::string &addr, int timeout_ms, std::string &err) {
	size_t colon = addr.rfind(':');
	if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
		err = "the address " + addr + " is not HOST:PORT";
		return -1;
	}
	std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
	if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
		host = host.substr(1, host.size() - 2);
	}
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
	if (rc != 0) {
		err = "resolving " + addr + ": " + gai_strerror(rc);
		return -1;
	}
	int fd = -1;
	err = "connecting to " + addr + ": no address";
	for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC_IF_ANY, a->ai_protocol);
		if (fd < 0) {
			continue;
		}
		// A non-blocking connect bounded by the timeout, then a blocking socket.
		int fl = fcntl(fd, F_GETFL, 0);
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
		int c = connect(fd, a->ai_addr, a->ai_addrlen);
		int e = c == 0 ? 0 : errno;
		if (e == EINPROGRESS) {
			struct pollfd p = {fd, POLLOUT, 0};
			int k = poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
			socklen_t len = sizeof(e);
			if (k == 0) {
				e = ETIMEDOUT;
			} else if (k < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) {
				e = errno;
			}
		}
		if (e == 0) {
			fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
			err.clear();
			break;
		}
		err = "connecting to " + addr + ": " + strerror(e);
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd >= 0) {
		mfnd_socket_options(fd, timeout_ms);
	}
	return fd;
}

int mfnd_peek_command(int fd, int timeout_ms) {
	uint8_t head[MFND_HEADER];
	auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
	while (std::chrono::steady_clock::now() < deadline) {
		struct pollfd p = {fd, POLLIN, 0};
		int k = poll(&p, 1, 100);
		if (k < 0 && errno != EINTR) {
			return -1;
		}
		if (k <= 0) {
			continue;
		}
		ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK);
		if (n == (ssize_t)sizeof(head)) {
			return head[4];
		}
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
			return -1; // closed before a whole header
		}
		usleep(1000); // part of the header: wait for the rest
	}
	return -1;
}

std::string mfnd_read_frame(int fd, uint32_t max, uint8_t *cmd, std::vector<uint8_t> &payload) {
	uint8_t head[MFND_HEADER];
	size_t got = 0;
	while (got < sizeof(head)) {
		ssize_t k = recv(fd, head + got, sizeof(head) - got, 0);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			return MFND_TIMEOUT;
		}
		if (k <= 0) {
			return got == 0 && k == 0 ? MFND_EOF : "the link was lost in the middle of a frame's header";
		}
		got += (size_t)k;
	}
	uint32_t len;
	memcpy(&len, head, 4);
	*cmd = head[4];
	if (len > max) {
		return "a frame of " + std::to_string(len) + " bytes, above the " + std::to_string(max) + " allowed here";
	}
	// Grown as the bytes arrive, a chunk at a time: the claimed length is not
	// allocated before it is sent.
	const size_t chunk = 1u << 20;
	payload.clear();
	for (size_t at = 0; at < len;) {
		size_t n = std::min((size_t)len - at, std::max(chunk, at));
		payload.resize(at + n);
		if (!mfnd_read_all(fd, payload.data() + at, n)) {
			return errno == EAGAIN || errno == EWOULDBLOCK ? MFND_TIMEOUT : "the link was lost in the middle of a frame";
		}
		at += n;
	}
	return "";
}
