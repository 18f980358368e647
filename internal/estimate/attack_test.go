package estimate

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestAttackCraftedGGUFHeaderAllocation: a model server answers with a header of a
// few hundred bytes that declares a 256 MiB string or 2^25 layers, in a file it says
// is 8 GiB (range reads of zeros after the header); the estimate must refuse it
// naming the limit, having allocated a small fraction of what the header declares.
// Before the limits the string cost 513 MiB of allocations and the layers panicked
// out of Estimate (the test binary died; `macfleet serve` calls it directly).
func TestAttackCraftedGGUFHeaderAllocation(t *testing.T) {
	const fileSize = 8 << 30
	for _, tc := range []struct {
		name, limit string
		header      []byte
	}{
		{"string", "string length", new(ggufsynth.Raw).String("general.architecture", "llama").
			StringLen("general.name", 256<<20, nil).Bytes()},
		{"layers", "block count", new(ggufsynth.Raw).String("general.architecture", "llama").
			Uint64("llama.block_count", 1<<25).Uint32("llama.feed_forward_length", 64).
			Uint32("llama.embedding_length", 64).Uint32("llama.attention.head_count", 1).
			Tensor("token_embd.weight", 0, 64, 16).Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := serveCrafted(t, tc.header, fileSize)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Estimate(t.Context(), Params{URL: srv.URL + "/crafted.gguf"})
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %d MiB; error: %v", allocated>>20, err)
			if err == nil || !strings.Contains(err.Error(), "declares a "+tc.limit) || !strings.Contains(err.Error(), "over the limit of") {
				t.Errorf("Estimate: %v, want an error naming the %s limit", err, tc.limit)
			}
			if allocated > 32<<20 {
				t.Errorf("reading the crafted header allocated %d MiB, want under 32 MiB", allocated>>20)
			}
		})
	}
}

// serveCrafted serves header followed by zeros as a file of size bytes, answering
// HEAD and range requests.
func serveCrafted(t *testing.T, header []byte, size int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "crafted.gguf", time.Time{}, io.NewSectionReader(&remoteHeader{bytes: header, size: size}, 0, size))
	}))
	t.Cleanup(srv.Close)
	return srv
}
