// The worker's model files: the one it is named, and, when that is the first part of
// a model stored in parts (NAME-00001-of-0000N.gguf, as llama.cpp's loader names
// them), the other parts beside it by name. A part its Mac does not store is skipped:
// a split worker's agent fetches only the parts that hold its layers' tensors, and a
// tensor asked from a missing part fails the command that asked for it, naming it.

#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf.h"

// nd_part_path is the path of part no (from 1) of count whose first part is first; ""
// when first is not named as a first part is.
static std::string nd_part_path(const std::string &first, int no, int count) {
	char suffix[64];
	snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", 1, count);
	size_t n = strlen(suffix);
	if (first.size() <= n || first.compare(first.size() - n, n, suffix) != 0) {
		return "";
	}
	snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", no, count);
	return first.substr(0, first.size() - n) + suffix;
}

// nd_open_part opens the GGUF file at path into p; "" or why not.
static std::string nd_open_part(nd_part &p) {
	struct gguf_init_params gp = {/*no_alloc*/ true, /*ctx*/ NULL};
	if ((p.gguf = gguf_init_from_file(p.path.c_str(), gp)) == NULL) {
		return p.path + " is not a readable GGUF file";
	}
	if ((p.file = open(p.path.c_str(), O_RDONLY)) < 0) {
		return "cannot open " + p.path + ": " + strerror(errno);
	}
	return "";
}

std::string nd_worker::open_parts(const char *model_path) {
	parts.push_back(nd_part{model_path});
	std::string e = nd_open_part(parts[0]);
	if (!e.empty()) {
		return e;
	}
	int64_t k = gguf_find_key(parts[0].gguf, "split.count");
	int count = k >= 0 && gguf_get_kv_type(parts[0].gguf, k) == GGUF_TYPE_UINT16 ? gguf_get_val_u16(parts[0].gguf, k) : 1;
	if (count <= 1) {
		return "";
	}
	if (nd_part_path(model_path, 1, count).empty()) {
		return std::string(model_path) + " is one of " + std::to_string(count) +
		       " parts but not named as the first part (NAME-00001-of-" + std::to_string(count) + ".gguf)";
	}
	for (int no = 2; no <= count; no++) {
		parts.push_back(nd_part{nd_part_path(model_path, no, count)});
		struct stat st;
		if (stat(parts.back().path.c_str(), &st) != 0 && errno == ENOENT) {
			continue; // not stored on this Mac: none of this worker's layers is in it
		}
		if (!(e = nd_open_part(parts.back())).empty()) {
			return e;
		}
	}
	return "";
}

const nd_part *nd_worker::find_tensor(const char *name, int64_t *id) {
	int missing = 0;
	for (const nd_part &p : parts) {
		if (p.gguf == NULL) {
			missing++;
			continue;
		}
		if ((*id = gguf_find_tensor(p.gguf, name)) >= 0) {
			return &p;
		}
	}
	if (missing == 0) {
		fail(std::string("tensor ") + name + " is not in the worker's model file: the worker's file differs");
	} else {
		fail(std::string("tensor ") + name + " is in none of the " + std::to_string(parts.size() - missing) + " of " +
		        std::to_string(parts.size()) + " parts of the model its Mac stores: the part that holds it was not fetched, " +
		        "or the worker's file differs");
	}
	return NULL;
}
