package testassets

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestWriteChatModelPrefersTrained: with a trained model present, its bytes are the
// chat model; without one, the random-weight Llama 3.1 model is.
func TestWriteChatModelPrefersTrained(t *testing.T) {
	dir := t.TempDir()
	trained := filepath.Join(dir, "trained.gguf")
	if err := os.WriteFile(trained, []byte("GGUF trained stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvTrainedModel, trained)
	out := filepath.Join(dir, "chat.gguf")
	ok, err := WriteChatModel(out)
	if err != nil || !ok {
		t.Fatalf("WriteChatModel = %v, %v with a trained model present", ok, err)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, []byte("GGUF trained stand-in")) {
		t.Errorf("the chat model is %q, not the trained one", b)
	}

	t.Setenv(EnvTrainedModel, filepath.Join(dir, "absent.gguf"))
	if ok, err = WriteChatModel(out); err != nil || ok {
		t.Fatalf("WriteChatModel = %v, %v without a trained model", ok, err)
	}
	spec, err := Llama31Spec()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "want.gguf")
	if err := ggufsynth.Write(want, spec); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(want)
	if !bytes.Equal(a, b) {
		t.Error("without a trained model the chat model is not Llama31Spec's")
	}
}
