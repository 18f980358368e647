// The worker's compute device and the byte ranges of its buffers (worker_device.h).
// Only generic ggml device and buffer APIs: the same code computes on the CPU here and
// on whatever GPU ggml registered in the build (Metal on Apple Silicon).

#include "worker_device.h"

#include <stdio.h>
#include <string.h>

#include "netdevice.h"

// first_of returns the first registered device of type t, or NULL.
static ggml_backend_dev_t first_of(enum ggml_backend_dev_type t) {
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		ggml_backend_dev_t d = ggml_backend_dev_get(i);
		if (ggml_backend_dev_type(d) == t) {
			return d;
		}
	}
	return NULL;
}

ggml_backend_dev_t mfnd_pick_device(int choice, std::string *err) {
	ggml_backend_dev_t gpu = first_of(GGML_BACKEND_DEVICE_TYPE_GPU);
	if (gpu == NULL) {
		gpu = first_of(GGML_BACKEND_DEVICE_TYPE_IGPU);
	}
	ggml_backend_dev_t cpu = first_of(GGML_BACKEND_DEVICE_TYPE_CPU);
	ggml_backend_dev_t d = NULL;
	switch (choice) {
	case MFND_DEVICE_AUTO:
		d = gpu != NULL ? gpu : cpu;
		break;
	case MFND_DEVICE_CPU:
		d = cpu;
		break;
	case MFND_DEVICE_GPU:
		if (gpu == NULL) {
			*err = "no GPU device is registered in this build on this host (ggml has only the CPU)";
			return NULL;
		}
		d = gpu;
		break;
	default:
		*err = "unknown device choice " + std::to_string(choice);
		return NULL;
	}
	if (d == NULL) {
		*err = "no CPU device is registered";
	}
	return d;
}

bool mfnd_host(ggml_backend_buffer_t b) { return ggml_backend_buffer_is_host(b); }

// range is a tensor of n bytes at addr in b, for the buffer calls that take a tensor:
// a GPU buffer locates a tensor's bytes by its data address within the buffer.
static struct ggml_tensor range(ggml_backend_buffer_t b, uint64_t addr, size_t n) {
	struct ggml_tensor t;
	memset(&t, 0, sizeof(t));
	t.type = GGML_TYPE_I8;
	t.buffer = b;
	t.data = (void *)(uintptr_t)addr;
	t.ne[0] = (int64_t)n;
	t.ne[1] = t.ne[2] = t.ne[3] = 1;
	t.nb[0] = 1;
	t.nb[1] = t.nb[2] = t.nb[3] = n;
	return t;
}

void mfnd_range_set(ggml_backend_buffer_t b, uint64_t addr, const void *src, size_t n) {
	if (n == 0) {
		return;
	}
	if (mfnd_host(b)) {
		memcpy((void *)(uintptr_t)addr, src, n);
		return;
	}
	struct ggml_tensor t = range(b, addr, n);
	ggml_backend_tensor_set(&t, src, 0, n);
}

void mfnd_range_get(ggml_backend_buffer_t b, uint64_t addr, void *dst, size_t n) {
	if (n == 0) {
		return;
	}
	if (mfnd_host(b)) {
		memcpy(dst, (const void *)(uintptr_t)addr, n);
		return;
	}
	struct ggml_tensor t = range(b, addr, n);
	ggml_backend_tensor_get(&t, dst, 0, n);
}

void mfnd_range_fill(ggml_backend_buffer_t b, uint64_t addr, uint8_t value, size_t n) {
	if (n == 0) {
		return;
	}
	if (mfnd_host(b)) {
		memset((void *)(uintptr_t)addr, value, n);
		return;
	}
	struct ggml_tensor t = range(b, addr, n);
	ggml_backend_tensor_memset(&t, value, 0, n);
}

void mfnd_range_copy(ggml_backend_buffer_t sb, uint64_t src, ggml_backend_buffer_t db, uint64_t dst, size_t n,
	std::vector<uint8_t> &stage) {
	if (n == 0) {
		return;
	}
	if (mfnd_host(sb) && mfnd_host(db)) {
		memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
		return;
	}
	stage.resize(n);
	mfnd_range_get(sb, src, stage.data(), n);
	mfnd_range_set(db, dst, stage.data(), n);
}

extern "C" int mfnd_worker_device(int choice, int *type, char *name, size_t namelen, char *err, size_t errlen) {
	std::string e;
	ggml_backend_dev_t d = mfnd_pick_device(choice, &e);
	if (d == NULL) {
		snprintf(err, errlen, "%s", e.c_str());
		return -1;
	}
	*type = (int)ggml_backend_dev_type(d);
	snprintf(name, namelen, "%s", ggml_backend_dev_name(d));
	return 0;
}
