package testassets

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/klauspost/compress/zstd"
)

// TrainedDraftModel is the draft model of the trained test model, as the repository
// keeps it: zstd-compressed (a GGUF of 12 MB in 2.4 MB; docs/testing.md). It shares
// the trained model's vocabulary and was trained on the same corpus with a smaller
// shape (hack/trained-model.sh, the draft's arguments), for speculative decoding.
const TrainedDraftModel = "test/models/tiny-chat-draft.gguf.zst"

// EnvDraftModel, when set, names the draft model file to use instead of the
// repository's: a GGUF, or a zstd-compressed one (NAME.zst, decompressed as the
// repository's is: a test binary run away from the checkout names the repository's).
const EnvDraftModel = "MACFLEET_DRAFT_MODEL"

// DraftModelPath is the trained draft model's GGUF, decompressed on first use into
// the user's cache (one file per compressed content), and whether it is there.
func DraftModelPath() (string, bool, error) {
	if p := os.Getenv(EnvDraftModel); p != "" {
		if _, err := os.Stat(p); err != nil {
			return p, false, nil
		}
		if filepath.Ext(p) != ".zst" {
			return p, true, nil
		}
		p, err := decompressed(p, filepath.Join(os.TempDir(), "macfleet-testassets"))
		return p, err == nil, err
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", false, nil
	}
	// This file is test/support/testassets/draft.go in the repository.
	src := filepath.Join(filepath.Dir(file), "..", "..", "..", filepath.FromSlash(TrainedDraftModel))
	if _, err := os.Stat(src); err != nil {
		return "", false, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	p, err := decompressed(src, filepath.Join(cache, "macfleet", "testassets"))
	return p, err == nil, err
}

// decompressed is the zstd file src decompressed into dir under a name that carries
// its content's digest, written once (to a temporary name, then renamed).
func decompressed(src, dir string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	dst := filepath.Join(dir, "draft-"+hex.EncodeToString(sum[:8])+".gguf")
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	dec, err := zstd.NewReader(in)
	if err != nil {
		return "", err
	}
	defer dec.Close()
	tmp, err := os.CreateTemp(dir, ".draft-*")
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(tmp, dec); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("decompressing %s: %w", src, err)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp.Name(), dst)
}
