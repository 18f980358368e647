package ggufsynth

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/fs/ggml"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func decodeFile(t *testing.T, path string) *ggml.GGML {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return g
}

func TestWritePartsSplitsTheTensorsWithTheSplitKeys(t *testing.T) {
	dir := t.TempDir()
	spec := Tiny()
	one := filepath.Join(dir, "one.gguf")
	if err := Write(one, spec); err != nil {
		t.Fatal(err)
	}
	paths, err := WriteParts(filepath.Join(dir, "tiny"), spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"tiny-00001-of-00003.gguf", "tiny-00002-of-00003.gguf", "tiny-00003-of-00003.gguf"}
	var got []string
	for _, p := range paths {
		got = append(got, filepath.Base(p))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("part names (-want +got):\n%s", diff)
	}

	whole := decodeFile(t, one)
	wantTensors := map[string]uint64{}
	for _, ts := range whole.Tensors().Items() {
		wantTensors[ts.Name] = ts.Size()
	}
	gotTensors := map[string]uint64{}
	for i, p := range paths {
		g := decodeFile(t, p)
		kv := g.KV()
		if kv[KeySplitNo] != uint16(i) || kv[KeySplitCount] != uint16(3) || kv[KeySplitTensorsCount] != int32(len(wantTensors)) {
			t.Errorf("part %d: split keys %T %v, %T %v, %T %v; want uint16 %d, uint16 3, int32 %d", i+1,
				kv[KeySplitNo], kv[KeySplitNo], kv[KeySplitCount], kv[KeySplitCount],
				kv[KeySplitTensorsCount], kv[KeySplitTensorsCount], i, len(wantTensors))
		}
		if _, ok := kv["general.architecture"]; ok != (i == 0) {
			t.Errorf("part %d: has the model's metadata: %v, want only in the first part", i+1, ok)
		}
		items := g.Tensors().Items()
		if len(items) == 0 {
			t.Errorf("part %d holds no tensor", i+1)
		}
		for _, ts := range items {
			gotTensors[ts.Name] = ts.Size()
		}
	}
	if diff := cmp.Diff(wantTensors, gotTensors); diff != "" {
		t.Errorf("tensors of the parts against the one file's (-want +got):\n%s", diff)
	}
	first := decodeFile(t, paths[0]).KV()
	for k, v := range whole.KV() {
		if k == "general.parameter_count" {
			continue // the decoder's count of the tensors it read
		}
		// Arrays decode to a type of unexported fields: compared deeply.
		if got := first[k]; !reflect.DeepEqual(v, got) {
			t.Errorf("first part's %s = %v, want the one file's %v", k, got, v)
		}
	}
}

func TestWritePartsRefusesMorePartsThanTensors(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 21, MaxParts + 1} {
		if _, err := WriteParts(filepath.Join(dir, "m"), Tiny(), n); err == nil {
			t.Errorf("WriteParts(%d parts) of a 20-tensor model: no error", n)
		}
	}
}

func TestPartPrefix(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prefix    string
		no, count int
		ok        bool
	}{
		{"Model-Q4_K_M-00001-of-00003.gguf", "Model-Q4_K_M", 1, 3, true},
		{"dir/a-00002-of-00002.gguf", "dir/a", 2, 2, true},
		{"a-00003-of-00002.gguf", "", 0, 0, false},
		{"a-00000-of-00002.gguf", "", 0, 0, false},
		{"-00001-of-00002.gguf", "", 0, 0, false},
		{"a-1-of-2.gguf", "", 0, 0, false},
		{"a-00001-of-00002.GGUF", "", 0, 0, false},
		{"model.gguf", "", 0, 0, false},
	} {
		prefix, no, count, ok := PartPrefix(tc.name)
		if prefix != tc.prefix || no != tc.no || count != tc.count || ok != tc.ok {
			t.Errorf("PartPrefix(%q) = %q %d %d %v, want %q %d %d %v", tc.name, prefix, no, count, ok, tc.prefix, tc.no, tc.count, tc.ok)
		}
	}
}

// TestRunnerLoadsThePartsFromTheFirst loads a model stored in three parts with the
// built runner, from its first part's path, and asks it what the one-file model
// answers; from the second part it does not load.
func TestRunnerLoadsThePartsFromTheFirst(t *testing.T) {
	bin := os.Getenv("MACFLEET_RUNNER")
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set (bin/macfleet-runner)")
	}
	dir := t.TempDir()
	spec := Tiny()
	one := filepath.Join(dir, "one.gguf")
	if err := Write(one, spec); err != nil {
		t.Fatal(err)
	}
	paths, err := WriteParts(filepath.Join(dir, "tiny"), spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := complete(t, bin, one)
	if got := complete(t, bin, paths[0]); got != want {
		t.Errorf("the three parts answer %q, the one file %q", got, want)
	}
	if _, h := load(t, bin, paths[1]); h.Status != runnerapi.StateFailed {
		t.Errorf("loading from the second part: %+v, want failed", h)
	}
	if err := os.Remove(paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, h := load(t, bin, paths[0]); h.Status != runnerapi.StateFailed {
		t.Errorf("loading with the third part missing: %+v, want failed", h)
	}
}

// runnerAt is a started runner: its process and its base URL.
type runnerAt struct {
	cmd  *exec.Cmd
	base string
}

func startRunner(t *testing.T, bin, model string) runnerAt {
	t.Helper()
	cmd := exec.Command(bin, "--model", model, "--threads", "1", "--addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	var ev runnerapi.ListeningEvent
	if err != nil || json.Unmarshal([]byte(line), &ev) != nil || ev.Addr == "" {
		t.Fatalf("runner's first line %q (%v)", line, err)
	}
	return runnerAt{cmd: cmd, base: "http://" + ev.Addr}
}

// load starts a runner on model and returns it with its health once it is ready or
// failed.
func load(t *testing.T, bin, model string) (runnerAt, runnerapi.Health) {
	t.Helper()
	r := startRunner(t, bin, model)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var h runnerapi.Health
		resp, err := http.Get(r.base + "/health")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&h)
			_ = resp.Body.Close()
		}
		if err == nil && (h.Status == runnerapi.StateReady || h.Status == runnerapi.StateFailed) {
			return r, h
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("runner on %s neither ready nor failed after 60s", model)
	return r, runnerapi.Health{}
}

// complete is model's greedy completion of a fixed prompt.
func complete(t *testing.T, bin, model string) string {
	t.Helper()
	r, h := load(t, bin, model)
	if h.Status != runnerapi.StateReady {
		t.Fatalf("runner on %s: %+v", model, h)
	}
	body := `{"model":"m","prompt":"the parts of a model","max_tokens":24,"temperature":0}`
	resp, err := http.Post(r.base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 {
		t.Fatalf("completion on %s: %d %+v %v", model, resp.StatusCode, out, err)
	}
	if out.Choices[0].Text == "" {
		t.Fatalf("completion on %s is empty", model)
	}
	return out.Choices[0].Text
}

func TestWritePartHeadersIsThePartsWithoutWeights(t *testing.T) {
	dir := t.TempDir()
	full, err := WriteParts(filepath.Join(dir, "full"), Tiny(), 2)
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := WritePartHeaders(filepath.Join(dir, "sparse"), Tiny(), 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range full {
		a, err := os.ReadFile(full[i])
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(sparse[i])
		if err != nil {
			t.Fatal(err)
		}
		g := decodeFile(t, sparse[i])
		header := int(g.Tensors().Offset)
		if len(a) != len(b) || !bytes.Equal(a[:header], b[:header]) {
			t.Errorf("part %d: sparse %d bytes, full %d; the headers (%d bytes) equal: %v", i+1, len(b), len(a), header, bytes.Equal(a[:header], b[:header]))
		}
		if bytes.Count(b[header:], []byte{0}) != len(b)-header {
			t.Errorf("part %d: the sparse file has weights", i+1)
		}
	}
}
