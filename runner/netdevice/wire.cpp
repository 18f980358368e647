// Helpers shared by the network device and the worker: the model file's identity and
// whole reads and writes on a socket.

#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
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

bool mfnd_write_all(int fd, const void *p, size_t n) {
	const char *b = (const char *)p;
	while (n > 0) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
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

bool mfnd_read_all(int fd, void *p, size_t n) {
	char *b = (char *)p;
	while (n > 0) {
		ssize_t k = recv(fd, b, n, 0);
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
