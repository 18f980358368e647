//go:build cgo && !race

// Package llama is a thin cgo binding over llama.h: models, contexts, batches,
// decoding, sequence memory and state, samplers, tokenization, chat templates and
// metadata. The compiled llama.cpp and ggml come from the ollama module's cgo packages
// (blank-imported below); the header include paths come from CGO_CPPFLAGS, which
// hack/go-env.sh sets. Only the runner imports this package, and it has no tests of its
// own, so `go test -race ./...` never compiles llama.cpp a second time.
//
// Nothing here is safe for concurrent use except the read-only Model methods
// (tokenization, pieces, metadata): one goroutine owns a Context and its batches.
package llama

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include <stdio.h>
#include <stdint.h>
#include "llama.h"
#include "gguf.h"

static int mf_log_verbose = 0;
static enum ggml_log_level mf_log_last = GGML_LOG_LEVEL_INFO;

static void mf_log(enum ggml_log_level level, const char *text, void *user) {
	(void)user;
	if (level != GGML_LOG_LEVEL_CONT) {
		mf_log_last = level;
	}
	if (mf_log_verbose || mf_log_last >= GGML_LOG_LEVEL_WARN) {
		fputs(text, stderr);
	}
}

static void mf_log_init(int verbose) {
	mf_log_verbose = verbose;
	llama_log_set(mf_log, NULL);
}

extern _Bool mfGoProgress(float progress, uintptr_t handle);

static _Bool mf_progress(float progress, void *user) {
	return mfGoProgress(progress, (uintptr_t)user);
}

static struct llama_model *mf_load_model(const char *path, int n_gpu_layers, _Bool use_mmap, uintptr_t handle,
		ggml_backend_dev_t *devices, const float *tensor_split) {
	struct llama_model_params p = llama_model_default_params();
	p.n_gpu_layers = n_gpu_layers;
	p.devices = devices;
	p.tensor_split = tensor_split;
	p.use_mmap = use_mmap;
	p.progress_callback = mf_progress;
	p.progress_callback_user_data = (void *)handle;
	return llama_model_load_from_file(path, p);
}

static uint64_t mf_gpu_allocated(void) {
	uint64_t used = 0;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		ggml_backend_dev_t dev = ggml_backend_dev_get(i);
		enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) {
			size_t free = 0, total = 0;
			ggml_backend_dev_memory(dev, &free, &total);
			// Metal reports free = working set - allocated; unsigned arithmetic gives
			// the allocated size back even when it exceeds the working set.
			used += (uint64_t)(total - free);
		}
	}
	return used;
}

#if defined(__GLIBC__)
#include <malloc.h>
static void mf_trim_heap(void) { malloc_trim(0); }
#elif defined(__APPLE__)
#include <malloc/malloc.h>
static void mf_trim_heap(void) { malloc_zone_pressure_relief(NULL, 0); }
#else
static void mf_trim_heap(void) {}
#endif

static int mf_gpu_count(void) {
	int n = 0;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) {
			n++;
		}
	}
	return n;
}

// mf_gpu_device is the i-th of the devices mf_gpu_count counts, in registry order.
static ggml_backend_dev_t mf_gpu_device(int i) {
	for (size_t k = 0; k < ggml_backend_dev_count(); k++) {
		ggml_backend_dev_t d = ggml_backend_dev_get(k);
		enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
		if ((t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) && i-- == 0) {
			return d;
		}
	}
	return NULL;
}

// mf_block_count reads a GGUF file's <architecture>.block_count (llama.cpp's
// n_layer): -1 for an unreadable file, -2 when the key is missing or not an integer.
static int64_t mf_block_count(const char *path) {
	struct gguf_init_params gp = {true, NULL};
	struct gguf_context *g = gguf_init_from_file(path, gp);
	if (g == NULL) {
		return -1;
	}
	int64_t n = -2;
	int64_t a = gguf_find_key(g, "general.architecture");
	if (a >= 0 && gguf_get_kv_type(g, a) == GGUF_TYPE_STRING) {
		char key[256];
		snprintf(key, sizeof(key), "%s.block_count", gguf_get_val_str(g, a));
		int64_t k = gguf_find_key(g, key);
		switch (k >= 0 ? gguf_get_kv_type(g, k) : GGUF_TYPE_COUNT) {
		case GGUF_TYPE_UINT16: n = gguf_get_val_u16(g, k); break;
		case GGUF_TYPE_INT16: n = gguf_get_val_i16(g, k); break;
		case GGUF_TYPE_UINT32: n = gguf_get_val_u32(g, k); break;
		case GGUF_TYPE_INT32: n = gguf_get_val_i32(g, k); break;
		case GGUF_TYPE_UINT64: n = (int64_t)gguf_get_val_u64(g, k); break;
		case GGUF_TYPE_INT64: n = gguf_get_val_i64(g, k); break;
		default: break;
		}
	}
	gguf_free(g);
	return n;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/cgo"
	"runtime/debug"
	"strings"
	"sync"
	"unsafe"

	// The compiled llama.cpp (and through it ggml with the CPU backend, plus Metal
	// and Accelerate on darwin/arm64).
	_ "github.com/ollama/ollama/llama/llama.cpp/src"
)

var initOnce sync.Once

// Init initialises the backends once; verbose forwards llama.cpp's info logs to stderr
// (warnings and errors always go there).
func Init(verbose bool) {
	initOnce.Do(func() {
		v := C.int(0)
		if verbose {
			v = 1
		}
		C.mf_log_init(v)
		C.llama_backend_init()
	})
}

// EngineVersion names the llama.cpp build linked in: the version of the ollama module
// that vendors it (and its sum when the build recorded one). Serialized states are only
// restorable into the engine version that wrote them.
func EngineVersion() string {
	const mod = "github.com/ollama/ollama"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == mod {
			if d.Replace != nil {
				d = d.Replace
			}
			return d.Path + "@" + d.Version + " " + d.Sum
		}
	}
	return "unknown"
}

// GPUCount is the number of GPU devices ggml registered (Metal on Apple Silicon).
func GPUCount() int { return int(C.mf_gpu_count()) }

// GPUDevices are the GPU devices ggml registered (GPUCount of them), as
// ggml_backend_dev_t handles for ModelParams.Devices.
func GPUDevices() []unsafe.Pointer {
	n := GPUCount()
	out := make([]unsafe.Pointer, 0, n)
	for i := range n {
		if d := C.mf_gpu_device(C.int(i)); d != nil {
			out = append(out, unsafe.Pointer(d))
		}
	}
	return out
}

// BlockCount reads a GGUF model's number of repeating layers (its architecture's
// block_count, llama.cpp's n_layer) without loading it.
func BlockCount(path string) (int, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	switch n := int64(C.mf_block_count(cpath)); {
	case n == -1:
		return 0, fmt.Errorf("%s is not a readable GGUF file", path)
	case n < 0:
		return 0, fmt.Errorf("%s has no integer <architecture>.block_count", path)
	default:
		return int(n), nil
	}
}

// GPUAllocatedBytes is the memory the GPU devices report in use (best effort; zero
// without a GPU).
func GPUAllocatedBytes() uint64 { return uint64(C.mf_gpu_allocated()) }

// TrimHeap returns free heap pages to the operating system (glibc malloc_trim, darwin
// malloc_zone_pressure_relief).
func TrimHeap() { C.mf_trim_heap() }

//export mfGoProgress
func mfGoProgress(progress C.float, handle C.uintptr_t) C._Bool {
	fn := cgo.Handle(handle).Value().(func(float32) bool)
	return C._Bool(fn(float32(progress)))
}

// ModelParams configures LoadModel.
type ModelParams struct {
	// GPULayers is the number of layers offloaded to the GPU (a large number means all).
	GPULayers int
	// Mmap maps the file instead of reading it into memory.
	Mmap bool
	// Progress is called during the load with a fraction in [0,1]; returning false
	// cancels the load.
	Progress func(float32) bool
	// Devices, when set, replaces the GPUs with these ggml devices (ggml_backend_dev_t:
	// GPUDevices', metal/runner/netdevice's): the last GPULayers layers go to them, in the
	// proportions of Split (one weight per device), the rest stay on the CPU.
	Devices []unsafe.Pointer
	Split   []float32
	// CPUOnly keeps every layer and every computation on the CPU, even where an
	// accelerator is registered (llama.cpp is given an empty list of devices).
	CPUOnly bool
}

// Model is a loaded model. Its read-only methods are safe for concurrent use.
type Model struct {
	c       *C.struct_llama_model
	vocab   *C.struct_llama_vocab
	pieces  [][]byte         // token id → text piece (control tokens render empty)
	control map[int32][]byte // the text of the tokens whose piece is empty (control tokens)
	eog     []bool

	utf8Once sync.Once
	utf8     *utf8Table // UTF-8 classes of the pieces, for sampling under a grammar
}

// LoadModel loads a GGUF file.
func LoadModel(path string, p ModelParams) (*Model, error) {
	progress := p.Progress
	if progress == nil {
		progress = func(float32) bool { return true }
	}
	h := cgo.NewHandle(progress)
	defer h.Delete()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var devs *C.ggml_backend_dev_t
	var split *C.float
	if len(p.Devices) > 0 {
		if len(p.Split) != len(p.Devices) {
			return nil, fmt.Errorf("%d devices but %d split weights", len(p.Devices), len(p.Split))
		}
		// C memory: llama.cpp reads the lists during the load only, and cgo forbids Go
		// pointers to Go pointers.
		n := len(p.Devices)
		devs = (*C.ggml_backend_dev_t)(C.calloc(C.size_t(n+1), C.size_t(unsafe.Sizeof(uintptr(0)))))
		defer C.free(unsafe.Pointer(devs))
		split = (*C.float)(C.calloc(C.size_t(max(n, int(C.llama_max_devices()))), C.size_t(unsafe.Sizeof(C.float(0)))))
		defer C.free(unsafe.Pointer(split))
		ds := unsafe.Slice(devs, n+1)
		ss := unsafe.Slice(split, n)
		for i, d := range p.Devices {
			ds[i] = C.ggml_backend_dev_t(d)
			ss[i] = C.float(p.Split[i])
		}
	}
	if p.CPUOnly && devs == nil {
		// A list holding only its terminator: no device, where nil means every GPU.
		devs = (*C.ggml_backend_dev_t)(C.calloc(1, C.size_t(unsafe.Sizeof(uintptr(0)))))
		defer C.free(unsafe.Pointer(devs))
	}
	c := C.mf_load_model(cpath, C.int(p.GPULayers), C._Bool(p.Mmap), C.uintptr_t(h), devs, split)
	if c == nil {
		return nil, fmt.Errorf("llama.cpp could not load %s (see its log on stderr)", path)
	}
	m := &Model{c: c, vocab: C.llama_model_get_vocab(c), control: map[int32][]byte{}}
	n := m.NVocab()
	m.pieces = make([][]byte, n)
	m.eog = make([]bool, n)
	buf := make([]byte, 256)
	for i := range n {
		k := C.llama_token_to_piece(m.vocab, C.llama_token(i), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, false)
		if k < 0 {
			buf = make([]byte, -k)
			k = C.llama_token_to_piece(m.vocab, C.llama_token(i), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, false)
		}
		if k > 0 {
			m.pieces[i] = append([]byte(nil), buf[:k]...)
		} else if t := m.TokenText(int32(i)); t != "" {
			m.control[int32(i)] = []byte(t)
		}
		m.eog[i] = bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(i)))
	}
	return m, nil
}

// Free releases the model. The model must not be used afterwards.
func (m *Model) Free() {
	if m.c != nil {
		C.llama_model_free(m.c)
		m.c = nil
	}
}

// NVocab is the vocabulary size.
func (m *Model) NVocab() int { return int(C.llama_vocab_n_tokens(m.vocab)) }

// NLayer is the number of transformer blocks.
func (m *Model) NLayer() int { return int(C.llama_model_n_layer(m.c)) }

// NHead is the number of attention heads.
func (m *Model) NHead() int { return int(C.llama_model_n_head(m.c)) }

// NHeadKV is the number of key/value heads.
func (m *Model) NHeadKV() int { return int(C.llama_model_n_head_kv(m.c)) }

// NEmbd is the embedding size.
func (m *Model) NEmbd() int { return int(C.llama_model_n_embd(m.c)) }

// NCtxTrain is the training context length.
func (m *Model) NCtxTrain() int { return int(C.llama_model_n_ctx_train(m.c)) }

// Size is the total size of the weights in bytes.
func (m *Model) Size() uint64 { return uint64(C.llama_model_size(m.c)) }

// NParams is the number of parameters.
func (m *Model) NParams() uint64 { return uint64(C.llama_model_n_params(m.c)) }

// Desc is llama.cpp's one-line description of the model.
func (m *Model) Desc() string {
	buf := make([]byte, 256)
	n := C.llama_model_desc(m.c, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n <= 0 {
		return ""
	}
	return string(buf[:min(int(n), len(buf)-1)])
}

// Meta returns a metadata value as a string.
func (m *Model) Meta(key string) (string, bool) {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	buf := make([]byte, 1024)
	n := C.llama_model_meta_val_str(m.c, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return "", false
	}
	if int(n) >= len(buf) {
		buf = make([]byte, int(n)+1)
		n = C.llama_model_meta_val_str(m.c, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	}
	return string(buf[:n]), true
}

// ChatTemplate is the model's default chat template, empty when it has none.
func (m *Model) ChatTemplate() string {
	t := C.llama_model_chat_template(m.c, nil)
	if t == nil {
		return ""
	}
	return C.GoString(t)
}

// BOS is the beginning-of-sequence token, -1 when the model has none.
func (m *Model) BOS() int32 { return int32(C.llama_vocab_bos(m.vocab)) }

// EOS is the end-of-sequence token, -1 when the model has none.
func (m *Model) EOS() int32 { return int32(C.llama_vocab_eos(m.vocab)) }

// TokenText is the text of a token with control tokens rendered too (the text
// Piece leaves out, e.g. "<|python_tag|>").
func (m *Model) TokenText(tok int32) string {
	if tok < 0 || int(tok) >= len(m.pieces) {
		return ""
	}
	buf := make([]byte, 256)
	k := C.llama_token_to_piece(m.vocab, C.llama_token(tok), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, true)
	if k < 0 {
		buf = make([]byte, -k)
		k = C.llama_token_to_piece(m.vocab, C.llama_token(tok), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, true)
	}
	if k <= 0 {
		return ""
	}
	return string(buf[:k])
}

// HasEncoder reports an encoder-decoder model (not supported by the runner).
func (m *Model) HasEncoder() bool { return bool(C.llama_model_has_encoder(m.c)) }

// AddBOS reports whether the tokenizer prepends BOS when adding special tokens.
func (m *Model) AddBOS() bool { return bool(C.llama_vocab_get_add_bos(m.vocab)) }

// IsEOG reports an end-of-generation token.
func (m *Model) IsEOG(tok int32) bool { return tok >= 0 && int(tok) < len(m.eog) && m.eog[tok] }

// Piece is the text of a token (empty for control tokens). The slice must not be
// modified.
func (m *Model) Piece(tok int32) []byte {
	if tok < 0 || int(tok) >= len(m.pieces) {
		return nil
	}
	return m.pieces[tok]
}

// PromptText is the text a token stands for in a prompt: its piece, or for a control
// token the text that tokenizes to it with special tokens parsed. The slice must not
// be modified.
func (m *Model) PromptText(tok int32) []byte {
	if p := m.Piece(tok); len(p) > 0 {
		return p
	}
	return m.control[tok]
}

// Tokenize converts text to tokens. addSpecial adds BOS (and EOS) as the model is
// configured to; parseSpecial turns control-token text such as <|im_start|> into the
// control tokens.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if len(text) > 1<<30 {
		return nil, errors.New("text too long to tokenize")
	}
	var ptr *C.char
	if len(text) > 0 {
		ptr = (*C.char)(unsafe.Pointer(unsafe.StringData(text)))
	}
	out := make([]int32, len(text)+4)
	n := C.llama_tokenize(m.vocab, ptr, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&out[0])),
		C.int32_t(len(out)), C._Bool(addSpecial), C._Bool(parseSpecial))
	if n < 0 {
		if n == C.INT32_MIN {
			return nil, errors.New("tokenization overflow")
		}
		out = make([]int32, -n)
		n = C.llama_tokenize(m.vocab, ptr, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&out[0])),
			C.int32_t(len(out)), C._Bool(addSpecial), C._Bool(parseSpecial))
		if n < 0 {
			return nil, fmt.Errorf("tokenization failed (%d)", int(n))
		}
	}
	return out[:n], nil
}

// ChatMessage is one message for ApplyChatTemplate.
type ChatMessage struct {
	Role, Content string
}

// ErrUnsupportedTemplate means llama.cpp does not recognise the chat template.
var ErrUnsupportedTemplate = errors.New("chat template not supported")

// ApplyChatTemplate formats msgs with tmpl, one of the templates llama.cpp recognises
// (an empty tmpl means chatml), adding the assistant prefix when addAssistant is set.
func ApplyChatTemplate(tmpl string, msgs []ChatMessage, addAssistant bool) (string, error) {
	// Everything handed to C lives in C memory: the message array holds pointers.
	var ctmpl *C.char
	if tmpl != "" {
		ctmpl = C.CString(tmpl)
		defer C.free(unsafe.Pointer(ctmpl))
	}
	n := len(msgs)
	var cmsgs *C.struct_llama_chat_message
	total := 0
	if n > 0 {
		cmsgs = (*C.struct_llama_chat_message)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_llama_chat_message{}))))
		defer C.free(unsafe.Pointer(cmsgs))
		arr := unsafe.Slice(cmsgs, n)
		for i, msg := range msgs {
			if strings.IndexByte(msg.Content, 0) >= 0 || strings.IndexByte(msg.Role, 0) >= 0 {
				return "", errors.New("message contains a NUL byte")
			}
			arr[i].role = C.CString(msg.Role)
			arr[i].content = C.CString(msg.Content)
			defer C.free(unsafe.Pointer(arr[i].role))
			defer C.free(unsafe.Pointer(arr[i].content))
			total += len(msg.Role) + len(msg.Content)
		}
	}
	size := 2*total + 256
	for range 2 {
		buf := (*C.char)(C.malloc(C.size_t(size)))
		r := C.llama_chat_apply_template(ctmpl, cmsgs, C.size_t(n), C._Bool(addAssistant), buf, C.int32_t(size))
		if r < 0 {
			C.free(unsafe.Pointer(buf))
			return "", ErrUnsupportedTemplate
		}
		if int(r) <= size {
			s := C.GoStringN(buf, r)
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		size = int(r)
	}
	return "", errors.New("chat template output changed size between calls")
}

// HasKVCells: the model's memory is an attention KV cache of cells (plain or with a
// sliding window), whose sequence state starts with the cells' positions; false for
// a recurrent or hybrid model, whose state is laid out otherwise.
func (m *Model) HasKVCells() bool { return !m.IsRecurrent() && !m.IsHybrid() }

// IsRecurrent: every layer of the model keeps a recurrent state (one per sequence,
// at its last position) instead of attention cells.
func (m *Model) IsRecurrent() bool { return bool(C.llama_model_is_recurrent(m.c)) }

// IsHybrid: some layers keep a recurrent state, the others attention cells.
func (m *Model) IsHybrid() bool { return bool(C.llama_model_is_hybrid(m.c)) }
