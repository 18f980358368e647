package testassets

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TrainedChatModel is where the small trained test model lives in the repository
// (docs/testing.md, "The trained test model"): the Llama 3 vocabulary and chat
// template with weights trained on the corpus test/trainmodel generates.
const TrainedChatModel = "test/models/tiny-chat-trained.gguf"

// EnvTrainedModel, when set, names the trained model file to use instead of the
// repository's (a machine without the checkout, or a model being tried out).
const EnvTrainedModel = "MACFLEET_TRAINED_MODEL"

// TrainedModelPath is the trained test model's file, and whether it is there.
func TrainedModelPath() (string, bool) {
	if p := os.Getenv(EnvTrainedModel); p != "" {
		_, err := os.Stat(p)
		return p, err == nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", false
	}
	// This file is test/support/testassets/trained.go in the repository.
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", filepath.FromSlash(TrainedChatModel))
	_, err := os.Stat(p)
	return p, err == nil
}

// WriteChatModel writes the chat model of the demo and of the tests that need
// answers in sentences and real tool calls to path: the trained test model when the
// repository has it, else Llama31Spec's random weights (same vocabulary and
// template). Tests that measure memory or speed synthesize their models instead.
// It reports whether the model written is the trained one.
func WriteChatModel(path string) (trained bool, err error) {
	if src, ok := TrainedModelPath(); ok {
		return true, copyFile(src, path)
	}
	spec, err := Llama31Spec()
	if err != nil {
		return false, err
	}
	return false, ggufsynth.Write(path, spec)
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, in); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
