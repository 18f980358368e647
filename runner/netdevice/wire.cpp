// Helpers shared by the network device and the worker: the model file's identity and
// whole reads and writes on a socket.

#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <unistd.h>

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

void mfnd_socket_options(int fd, int timeout_ms) {
	if (timeout_ms > 0) {
		struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
	setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
}

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
