package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/hubdouble"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// hubDouble is the model hub's double (test/support/hubdouble) serving to the holder
// of one token only.
type hubDouble struct{ *hubdouble.Hub }

func newHubDouble(t *testing.T, path, token string, content []byte) *hubDouble {
	t.Helper()
	return newHubDoubleAt(t, path, token, bytes.NewReader(content), int64(len(content)))
}

// newHubDoubleAt is newHubDouble serving size bytes of content: a sparse model file
// of several GiB, of which a reader of its header asks only the start.
func newHubDoubleAt(t *testing.T, path, token string, content io.ReaderAt, size int64) *hubDouble {
	t.Helper()
	return newHubDoubleOf(t, token, hubdouble.Content(path, content, size))
}

// newHubDoubleFiles serves the local files of files (the hub's path → the file) the
// way newHubDouble serves one: the parts of a model stored in several files.
func newHubDoubleFiles(t *testing.T, token string, files map[string]string) *hubDouble {
	t.Helper()
	return newHubDoubleOf(t, token, hubdouble.LocalFiles(files))
}

// newHubDoubleOf serves files to the holder of token only.
func newHubDoubleOf(t *testing.T, token string, files hubdouble.Files) *hubDouble {
	t.Helper()
	h := hubdouble.New(files)
	h.Gate("/", token)
	t.Cleanup(h.Close)
	return &hubDouble{h}
}

func (h *hubDouble) requests() []string { return h.Requests() }

// loopbackPolicy writes a SourcePolicy that lets serve pull hf:// sources from the hub
// double on loopback (the default policy denies loopback addresses).
func loopbackPolicy(t *testing.T) string {
	t.Helper()
	return loopbackPolicyFor(t, "hf")
}

// loopbackPolicyFor writes a SourcePolicy that lets serve use the registries (hf,
// ollama) on loopback.
func loopbackPolicyFor(t *testing.T, registries string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(`apiVersion: macfleet.dev/v1alpha1
kind: SourcePolicy
metadata:
  name: default
spec:
  rules:
  - namespaces: ["serve"]
    registries: [`+registries+`]
  allowedNetworks: ["127.0.0.0/8"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyHubModel is a synthesized GGUF and its sha256.
func tinyHubModel(t *testing.T) ([]byte, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(p, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return b, hex.EncodeToString(s[:])
}

const (
	hubPath  = "/org/tiny-GGUF/resolve/main/tiny.gguf"
	hubModel = "hf://org/tiny-GGUF/tiny.gguf"
)

// TestServePullsFromTheHub: `macfleet serve --model NAME=hf://…` pulls the file from
// the hub (a double on loopback, allowed by --source-policy) with the token of
// $HF_TOKEN, verifies its sha256, serves it — a real runner answering the official
// OpenAI client — and keeps it in the model store.
func TestServePullsFromTheHub(t *testing.T) {
	runner := runnerOrSkip(t)
	content, digest := tinyHubModel(t)
	hub := newHubDouble(t, hubPath, "hf_gated", content)
	t.Setenv(hfTokenEnv, "hf_gated")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	storeDir := t.TempDir()

	cmd := newServeCommand()
	cmd.SetArgs([]string{"--model", "tiny=" + hubModel + ":sha256=" + digest + ",ctx=256,parallel=1",
		"--listen", addr, "--store-dir", storeDir, "--hf-endpoint", hub.URL, "--source-policy", loopbackPolicy(t),
		"--prompt-cache-dir", t.TempDir(), "--runner", runner, "--runner-threads", "1"})
	t.Cleanup(runServe(t, cmd, addr))
	client := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer ccancel()
	resp, err := client.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}, MaxTokens: openai.Int(4)})
	if err != nil {
		t.Fatalf("a chat completion from the pulled model: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Usage.CompletionTokens < 1 {
		t.Errorf("response %+v: want one choice with completion tokens", resp)
	}

	// One download, with the token; the file is in the store.
	if got := hub.requests(); len(got) != 1 || got[0] != "GET "+hubPath+" Bearer hf_gated" {
		t.Errorf("the hub saw %q; want one GET of %s with the token", got, hubPath)
	}
	found := false
	_ = filepath.WalkDir(storeDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, err := os.ReadFile(p); err == nil && string(b) == string(content) {
				found = true
			}
		}
		return nil
	})
	if !found {
		t.Errorf("the pulled model is not in the store %s", storeDir)
	}
}

// TestServeRefusesPulls: a wrong digest, a missing token and the default source policy
// each stop serve before it serves, saying why; nothing is served from a bad file.
func TestServeRefusesPulls(t *testing.T) {
	content, digest := tinyHubModel(t)
	hub := newHubDouble(t, hubPath, "hf_gated", content)
	policy := loopbackPolicy(t)
	wrong := strings.Repeat("0", 64)
	for _, tc := range []struct {
		name, token string
		args        []string
		want        string
	}{
		{"wrong sha256", "hf_gated", []string{"--model", "tiny=" + hubModel + ":sha256=" + wrong, "--source-policy", policy},
			"sha256 mismatch for " + hubModel + ": expected " + wrong + ", the downloaded file has " + digest},
		{"no token for a gated model", "", []string{"--model", "tiny=" + hubModel, "--source-policy", policy}, "--hf-token or $HF_TOKEN"},
		{"the default policy denies loopback", "hf_gated", []string{"--model", "tiny=" + hubModel}, "loopback"},
		{"sha256 of a local file", "", []string{"--model", "tiny=/models/t.gguf:sha256=" + digest}, "sha256= checks a pulled source"},
		{"a later part of a model stored in parts", "", []string{"--model", "big=hf://org/big-GGUF/big-Q4_K_M-00002-of-00003.gguf", "--source-policy", policy},
			"is part 2 of the 3 files of a model: name its first part, hf://org/big-GGUF/big-Q4_K_M-00001-of-00003.gguf"},
		{"a part missing from the hub", "hf_gated", []string{"--model", "big=hf://org/tiny-GGUF/tiny-00001-of-00003.gguf", "--source-policy", policy},
			"part 1 of the 3 files of hf://org/tiny-GGUF/tiny-00001-of-00003.gguf: downloading hf://org/tiny-GGUF/tiny-00001-of-00003.gguf: GET " +
				hub.URL + "/org/tiny-GGUF/resolve/main/tiny-00001-of-00003.gguf: 404 Not Found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(hfTokenEnv, tc.token)
			cmd := newServeCommand()
			cmd.SetArgs(append(tc.args, "--listen", "127.0.0.1:0", "--store-dir", t.TempDir(), "--hf-endpoint", hub.URL,
				"--prompt-cache-dir", t.TempDir()))
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("serve: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// runServe runs the serve command cmd, listening on addr, until it answers /readyz,
// and returns what stops it and checks that it stopped cleanly.
func runServe(t *testing.T, cmd *cobra.Command, addr string) (stop func()) {
	t.Helper()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("serve ended before it served: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("/readyz: %d", resp.StatusCode)
	})
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve stopped with: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("serve did not stop within a minute")
		}
	}
}
