package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// server is one server process on a loopback port, in its own process group so that
// stopping it also stops what it started (the peer's runner processes).
type server struct {
	name    string
	base    string
	cmd     *exec.Cmd
	out     *syncbuf.Buffer
	exited  chan struct{}
	waitErr error
	client  *http.Client
	// unload unloads the model and returns when it is gone.
	unload func(ctx context.Context) error
}

func start(name string, cmd *exec.Cmd) (*server, error) {
	s := &server{name: name, cmd: cmd, out: &syncbuf.Buffer{}, exited: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 128}}}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// stop sends SIGTERM and waits up to 30 s, then kills the whole process group.
func (s *server) stop() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	// Whatever the server started and left behind goes with its group.
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
}

// waitFor polls cond every 20 ms until it holds, the server exits or timeout passes.
func (s *server) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-s.exited:
			return fmt.Errorf("%s exited (%v) while waiting until %s; output:\n%s", s.name, s.waitErr, what, tail(s.out.String(), 4000))
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting until %s: %w; output:\n%s", s.name, what, ctx.Err(), tail(s.out.String(), 4000))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// call sends a JSON request (nil: no body) and decodes a JSON answer into out (nil:
// discarded); any status but 200/201 is an error.
func (s *server) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader = http.NoBody
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", s.name, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", s.name, method, path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%s: %s %s: %s: %s", s.name, method, path, resp.Status, tail(string(b), 500))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: %s %s: decoding %q: %w", s.name, method, path, tail(string(b), 300), err)
		}
	}
	return nil
}

// macfleetConfig is how `macfleet serve` is started.
type macfleetConfig struct {
	bin, runner, model, dir string
	ctx, parallel, threads  int
	// defaults gives serve the model alone: its own context, slots, threads and
	// prompt cache (in dir), as a user who names only the model gets them.
	defaults bool
}

// servingLine is the log line of `macfleet serve` with the address it serves.
var servingLine = regexp.MustCompile(`"msg"="Serving the OpenAI and admin API" "addr"="([^"]+)"`)

// startMacfleet runs `macfleet serve` with the model (prompt cache off, never idling
// out during the run), waits until it serves and loads the model.
func startMacfleet(ctx context.Context, c macfleetConfig) (*server, error) {
	args := []string{"serve", "--listen", "127.0.0.1:0", "--runner", c.runner, "--idle-timeout", "1h",
		"--prompt-cache-dir", filepath.Join(c.dir, "prompt-cache")}
	if c.defaults {
		args = append(args, "--model", fmt.Sprintf("%s=%s", modelName, c.model))
	} else {
		args = append(args, "--runner-threads", strconv.Itoa(c.threads),
			"--prompt-cache-hot-bytes", "0", "--prompt-cache-ssd-bytes", "0",
			"--model", fmt.Sprintf("%s=%s:ctx=%d,parallel=%d,cache=off", modelName, c.model, c.ctx, c.parallel))
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Env = os.Environ()
	name := "macfleet"
	if c.defaults {
		name = "macfleet-defaults"
	}
	s, err := start(name, cmd)
	if err != nil {
		return nil, err
	}
	if err := s.waitFor(ctx, time.Minute, "it logs the address it serves", func() bool {
		m := servingLine.FindStringSubmatch(s.out.String())
		if m != nil {
			s.base = "http://" + m[1]
		}
		return m != nil
	}); err != nil {
		s.stop()
		return nil, err
	}
	s.unload = func(ctx context.Context) error {
		return s.call(ctx, http.MethodPost, "/api/models/"+modelName+"/unload?wait=true", nil, nil)
	}
	if err := s.call(ctx, http.MethodPost, "/api/models/"+modelName+"/load", nil, nil); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// peerConfig is how the peer server is started: matched to macfleet's settings, or at
// its defaults (parallel, ctx, threads and gpuLayers 0).
type peerConfig struct {
	name, bin, dir         string
	model, digest          string // the GGUF file and its "sha256:HEX" digest
	ctx, parallel, threads int
	// gpuLayers, when set, is the model's num_gpu: the layers offloaded to the GPU.
	gpuLayers int
	// lib, when set, is its OLLAMA_LIBRARY_PATH: where it finds its GPU backends.
	lib string
}

// startPeer runs the peer server on a free loopback port with its home and model store
// in dir and its cloud features off, gives it the GGUF file as a blob of its store,
// creates the model through its create API (with num_ctx, num_thread and num_gpu as the
// model's parameters when set), and loads it.
func startPeer(ctx context.Context, c peerConfig) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.bin, "serve")
	env := []string{"HOME=" + c.dir, "OLLAMA_HOST=127.0.0.1:" + strconv.Itoa(port),
		"OLLAMA_MODELS=" + filepath.Join(c.dir, "models"), "OLLAMA_NO_CLOUD=1", "OLLAMA_KEEP_ALIVE=1h"}
	if c.parallel > 0 {
		env = append(env, "OLLAMA_NUM_PARALLEL="+strconv.Itoa(c.parallel))
	}
	if c.lib != "" {
		env = append(env, "OLLAMA_LIBRARY_PATH="+c.lib)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OLLAMA_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	s, err := start(c.name, cmd)
	if err != nil {
		return nil, err
	}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", port)
	ok := func() error {
		if err := s.waitFor(ctx, time.Minute, "GET /api/version answers", func() bool {
			return s.call(ctx, http.MethodGet, "/api/version", nil, nil) == nil
		}); err != nil {
			return err
		}
		if err := s.putBlob(ctx, c.model, c.digest, filepath.Join(c.dir, "models")); err != nil {
			return err
		}
		params := map[string]any{}
		if c.ctx > 0 {
			params["num_ctx"] = c.ctx
		}
		if c.threads > 0 {
			params["num_thread"] = c.threads
		}
		if c.gpuLayers > 0 {
			params["num_gpu"] = c.gpuLayers
		}
		create := map[string]any{"model": modelName, "files": map[string]string{filepath.Base(c.model): c.digest}, "stream": false}
		if len(params) > 0 {
			create["parameters"] = params
		}
		if err := s.call(ctx, http.MethodPost, "/api/create", create, nil); err != nil {
			return err
		}
		return s.call(ctx, http.MethodPost, "/api/generate", map[string]any{"model": modelName}, nil)
	}()
	if ok != nil {
		s.stop()
		return nil, ok
	}
	s.unload = func(ctx context.Context) error {
		if err := s.call(ctx, http.MethodPost, "/api/generate", map[string]any{"model": modelName, "keep_alive": 0}, nil); err != nil {
			return err
		}
		// The answer can come before the model is gone: poll the list of loaded models.
		return s.waitFor(ctx, time.Minute, "the model leaves /api/ps", func() bool {
			var ps struct {
				Models []struct {
					Name string `json:"name"`
				} `json:"models"`
			}
			return s.call(ctx, http.MethodGet, "/api/ps", nil, &ps) == nil && len(ps.Models) == 0
		})
	}
	return s, nil
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// putBlob gives the peer the model file as the blob digest: a hard link in its blob
// store (models/blobs/sha256-HEX) when the file system allows one, which the peer then
// reports as present; else an upload through its blob API. A link costs no copy of a
// model of many gigabytes (nor the disk for one per peer server).
func (s *server) putBlob(ctx context.Context, model, digest, store string) error {
	blob := filepath.Join(store, "blobs", strings.Replace(digest, ":", "-", 1))
	if os.MkdirAll(filepath.Dir(blob), 0o755) == nil && os.Link(model, blob) == nil &&
		s.call(ctx, http.MethodHead, "/api/blobs/"+digest, nil, nil) == nil {
		return nil
	}
	_ = os.Remove(blob)
	f, err := os.Open(model)
	if err != nil {
		return err
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/blobs/"+digest, f)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: uploading the model: %w", s.name, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: uploading the model: %s", s.name, resp.Status)
	}
	return nil
}

// freePort asks the kernel for a free loopback port. The peer takes its address from
// the environment, so the port is closed again before it listens: another process could
// take it in between, which startPeer reports as the peer failing to start.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
