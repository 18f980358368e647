// The worker's compute device and its memory: which ggml device the worker computes
// with, and reads and writes of byte ranges of its buffers, which are host memory on
// the CPU but need not be on a GPU (worker_device.cpp).
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "ggml-backend.h"

// mfnd_pick_device returns the device for a choice of netdevice.h (MFND_DEVICE_*),
// or NULL with a message in err.
ggml_backend_dev_t mfnd_pick_device(int choice, std::string *err);

// mfnd_host says whether b is host memory, which the worker reads and writes directly
// (the CPU's buffers); any other buffer goes through ggml's buffer interface.
bool mfnd_host(ggml_backend_buffer_t b);

// The ranges below lie within buffer b (the caller checked). On a host buffer they
// are plain memory operations; otherwise they go through the buffer's interface.
void mfnd_range_set(ggml_backend_buffer_t b, uint64_t addr, const void *src, size_t n);
void mfnd_range_get(ggml_backend_buffer_t b, uint64_t addr, void *dst, size_t n);
void mfnd_range_fill(ggml_backend_buffer_t b, uint64_t addr, uint8_t value, size_t n);
// mfnd_range_copy copies n bytes from src in sb to dst in db (the ranges may overlap),
// through stage when either buffer is not host memory.
void mfnd_range_copy(ggml_backend_buffer_t sb, uint64_t src, ggml_backend_buffer_t db, uint64_t dst, size_t n,
	std::vector<uint8_t> &stage);
