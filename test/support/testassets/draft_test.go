package testassets

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestDecompressedOnceByContent: a zstd file comes out as its bytes, under a name of
// its content, and a second call finds the file written by the first.
func TestDecompressedOnceByContent(t *testing.T) {
	dir := t.TempDir()
	want := bytes.Repeat([]byte("GGUF draft stand-in "), 1000)
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "m.gguf.zst")
	if err := os.WriteFile(src, enc.EncodeAll(want, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := decompressed(src, filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
		t.Fatalf("decompressed %d bytes, want %d", len(got), len(want))
	}
	if err := os.WriteFile(p, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if q, err := decompressed(src, filepath.Join(dir, "cache")); err != nil || q != p {
		t.Fatalf("second call: %s, %v; want %s again", q, err, p)
	}
	if got, _ := os.ReadFile(p); string(got) != "kept" {
		t.Errorf("the second call wrote the file again")
	}
}

// TestTrainedDraftIsAGGUF: the repository's draft decompresses into a GGUF file.
func TestTrainedDraftIsAGGUF(t *testing.T) {
	t.Setenv(EnvDraftModel, "")
	p, ok, err := DraftModelPath()
	if err != nil || !ok {
		t.Fatalf("DraftModelPath = %s, %v, %v", p, ok, err)
	}
	b := make([]byte, 4)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Read(b); err != nil || string(b) != "GGUF" {
		t.Errorf("%s starts %q, want GGUF", p, b)
	}
}
