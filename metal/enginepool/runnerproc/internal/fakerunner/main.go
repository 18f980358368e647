// Command fakerunner speaks the runner protocol of docs/runner-protocol.md without a
// model, so the process runner of package metal can be tested on any machine and on
// misbehaviour a real runner shows only rarely. Its -fake-* flags make it load slowly,
// fail to load, ignore /shutdown or SIGTERM, crash in the middle of a stream, or never
// announce its socket.
//
// Completions stream one token ("t0 ", "t1 ", …) per -fake-token-interval for
// max_tokens tokens. GET /debug/limits returns the last limits pushed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	o := parseFlags()
	if (o.socket == "") == (o.addr == "") {
		fmt.Fprintln(os.Stderr, "exactly one of --socket and --addr is required")
		os.Exit(2)
	}

	if o.ignoreTrm {
		signal.Ignore(syscall.SIGTERM)
	}
	if o.noListen {
		fmt.Fprintln(os.Stderr, "fakerunner: not listening, as told")
		for {
			time.Sleep(time.Hour)
		}
	}

	ln := listen(o)
	s := &server{parallel: o.parallel, ceiling: o.ceiling, state: "loading", interval: o.interval,
		crashAt: o.crashAt, ignoreShutdown: o.ignoreSD, stop: make(chan struct{}), abort: make(chan struct{})}
	srv := &http.Server{Handler: s.routes()}
	go srv.Serve(ln)
	announce(o, ln)

	failLoad := o.failLoad
	if o.probeRead != "" || o.probeDial != "" || o.probeUnix != "" {
		failLoad = probe(o.probeRead, o.probeDial, o.probeUnix)
	}
	go s.load(o.model, o.loadTime, failLoad, o.failStay)

	if !o.ignoreTrm {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		go func() {
			<-sigs
			s.requestStop()
		}()
	}
	<-s.stop
	s.shutdown(srv)
	fmt.Fprintln(os.Stderr, "fakerunner: stopped")
	os.Exit(0)
}

// options are the fakerunner's flags: the runner's own, the ones it accepts and
// ignores, and the -fake-* ones that make it misbehave.
type options struct {
	model, socket, addr             string
	parallel                        int
	ceiling                         int64
	loadTime                        time.Duration
	failLoad                        string
	failStay                        time.Duration
	ignoreSD, ignoreTrm             bool
	crashAt                         int
	interval                        time.Duration
	noListen, stdoutLog             bool
	probeRead, probeDial, probeUnix string
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.model, "model", "", "model path")
	flag.StringVar(&o.socket, "socket", "", "unix socket path")
	flag.StringVar(&o.addr, "addr", "", "loopback TCP address")
	_ = flag.Int("ctx", 0, "total context")
	flag.IntVar(&o.parallel, "parallel", 1, "slots")
	_ = flag.Int("batch", 0, "batch")
	_ = flag.Int("threads", 0, "threads")
	_ = flag.String("kv-type", "f16", "KV cache type")
	flag.Int64Var(&o.ceiling, "ceiling-bytes", 0, "own memory ceiling")
	_ = flag.String("alias", "", "served name")
	flag.DurationVar(&o.loadTime, "fake-load-time", 0, "time the fake load takes")
	flag.StringVar(&o.failLoad, "fake-fail-load", "", "fail the load with this message")
	flag.DurationVar(&o.failStay, "fake-fail-linger", 0, "keep answering /health after a failed load this long before exiting 3")
	flag.BoolVar(&o.ignoreSD, "fake-ignore-shutdown", false, "answer /shutdown 202 and do nothing")
	flag.BoolVar(&o.ignoreTrm, "fake-ignore-sigterm", false, "ignore SIGTERM")
	flag.IntVar(&o.crashAt, "fake-crash-after", 0, "SIGKILL itself after streaming this many tokens")
	flag.DurationVar(&o.interval, "fake-token-interval", 5*time.Millisecond, "time between streamed tokens")
	flag.BoolVar(&o.noListen, "fake-no-listen", false, "never print the listening line")
	flag.BoolVar(&o.stdoutLog, "fake-chatty", false, "print lines to stdout before the listening line")
	flag.StringVar(&o.probeRead, "fake-read", "", "read this file, as a loader bug would, and fail the load with what it got")
	flag.StringVar(&o.probeDial, "fake-dial", "", "connect to this TCP address and fail the load with the outcome")
	flag.StringVar(&o.probeUnix, "fake-dial-unix", "", "connect to this unix socket and fail the load with the outcome")
	_ = flag.Bool("trace-relay", false, "accepted; the fake runner makes no spans (it answers POST /spans 404)")
	_ = flag.String("split-worker", "", "accepted: a split head's worker (the fake runner computes no layers)")
	_ = flag.Int("split-layers", 0, "accepted with -split-worker")
	flag.Parse()
	return o
}

// listen listens on the unix socket or the TCP address of o, or exits 1.
func listen(o options) net.Listener {
	var ln net.Listener
	var err error
	if o.socket != "" {
		ln, err = net.Listen("unix", o.socket)
	} else {
		ln, err = net.Listen("tcp", o.addr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	return ln
}

// announce prints the listening line (after some noise with -fake-chatty).
func announce(o options, ln net.Listener) {
	if o.stdoutLog {
		fmt.Println("fakerunner starting")
		fmt.Println("{not json")
	}
	ev := map[string]any{"event": "listening", "pid": os.Getpid()}
	if o.socket != "" {
		ev["socket"] = o.socket
	} else {
		ev["addr"] = ln.Addr().String()
	}
	b, _ := json.Marshal(ev)
	fmt.Println(string(b))
}

type server struct {
	parallel       int
	ceiling        int64
	interval       time.Duration
	crashAt        int
	ignoreShutdown bool

	mu       sync.Mutex
	state    string
	progress float64
	errMsg   string
	limits   json.RawMessage
	active   int
	abort    chan struct{} // closed and replaced by /abort
	stopOnce sync.Once
	stop     chan struct{}
}

func (s *server) load(model string, d time.Duration, fail string, linger time.Duration) {
	if fail == "" {
		if _, err := os.Stat(model); err != nil {
			fail = fmt.Sprintf("loading model: %v", err)
		}
	}
	const steps = 10
	for i := 1; i <= steps; i++ {
		time.Sleep(d / steps)
		s.mu.Lock()
		s.progress = float64(i) / steps
		s.mu.Unlock()
	}
	s.mu.Lock()
	if fail != "" {
		s.state, s.errMsg = "failed", fail
		s.mu.Unlock()
		fmt.Fprintln(os.Stderr, "fakerunner: error:", fail)
		time.Sleep(linger)
		os.Exit(3)
	}
	s.state = "ready"
	s.mu.Unlock()
}

func (s *server) requestStop() { s.stopOnce.Do(func() { close(s.stop) }) }

// shutdown moves to stopping, aborts the requests in flight and shuts srv down.
func (s *server) shutdown(srv *http.Server) {
	s.mu.Lock()
	s.state = "stopping"
	s.mu.Unlock()
	s.abortAll()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

func (s *server) abortAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.active
	close(s.abort)
	s.abort = make(chan struct{})
	return n
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": code}})
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		h := map[string]any{"status": s.state, "progress": s.progress}
		if s.errMsg != "" {
			h["error"] = s.errMsg
		}
		ready := s.state == "ready"
		s.mu.Unlock()
		status := http.StatusOK
		if !ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, h)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{
			"state": s.state, "pid": os.Getpid(), "footprint_bytes": 1 << 20,
			"kv_cells_used": 0, "kv_cells_total": 1024, "slots_total": s.parallel,
			"slots_busy": min(s.active, s.parallel), "requests_active": s.active,
			"ceiling_bytes": s.ceiling,
		})
	})
	mux.HandleFunc("POST /limits", func(w http.ResponseWriter, r *http.Request) {
		var l struct {
			CeilingBytes   *int64 `json:"ceiling_bytes"`
			HardLimitBytes *int64 `json:"hard_limit_bytes"`
			HostUsedBytes  *int64 `json:"host_used_bytes"`
		}
		raw := json.RawMessage{}
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil || json.Unmarshal(raw, &l) != nil || l.CeilingBytes == nil {
			writeError(w, http.StatusBadRequest, "invalid_json", "limits need ceiling_bytes")
			return
		}
		s.mu.Lock()
		s.limits = raw
		s.ceiling = *l.CeilingBytes
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{})
	})
	mux.HandleFunc("GET /debug/limits", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(s.limits)
	})
	mux.HandleFunc("POST /cache/clear", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"bytes_reclaimed": 4096, "entries_cleared": 2})
	})
	mux.HandleFunc("POST /abort", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"aborted": s.abortAll()})
	})
	mux.HandleFunc("POST /shutdown", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusAccepted, map[string]any{})
		if !s.ignoreShutdown {
			s.requestStop()
		}
	})
	mux.HandleFunc("POST /v1/completions", s.completions)
	return mux
}

func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    string `json:"prompt"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	s.mu.Lock()
	if s.state != "ready" {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "model_loading", "model is "+s.state)
		return
	}
	s.active++
	abort := s.abort
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.active--
		s.mu.Unlock()
	}()
	if req.MaxTokens <= 0 {
		req.MaxTokens = 16
	}

	var text strings.Builder
	flusher, _ := w.(http.Flusher)
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
	}
	for i := range req.MaxTokens {
		if s.crashAt > 0 && i == s.crashAt {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		tok := fmt.Sprintf("t%d ", i)
		text.WriteString(tok)
		if req.Stream {
			b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "text": tok}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			if flusher != nil {
				flusher.Flush()
			}
		}
		t := time.NewTimer(s.interval)
		select {
		case <-abort:
			t.Stop()
			if req.Stream {
				fmt.Fprintf(w, "data: {\"error\":{\"message\":\"aborted\",\"type\":\"server_error\",\"code\":\"aborted\"}}\n\n")
				return
			}
			writeError(w, http.StatusServiceUnavailable, "aborted", "aborted")
			return
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	if req.Stream {
		fmt.Fprintf(w, "data: [DONE]\n\n")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"choices": []any{map[string]any{"index": 0, "text": text.String(), "finish_reason": "length"}}})
}

// probe tries what a compromised runner would (read a file, connect out) and says
// what it got.
func probe(path, addr, unixSocket string) string {
	var out []string
	if path != "" {
		if b, err := os.ReadFile(path); err != nil {
			out = append(out, fmt.Sprintf("read %s: %v", path, err))
		} else {
			out = append(out, fmt.Sprintf("read %s: %q", path, b))
		}
	}
	for _, d := range []struct{ network, addr string }{{"tcp", addr}, {"unix", unixSocket}} {
		if d.addr == "" {
			continue
		}
		if c, err := net.DialTimeout(d.network, d.addr, 5*time.Second); err != nil {
			out = append(out, fmt.Sprintf("dial %s: %v", d.addr, err))
		} else {
			c.Close()
			out = append(out, fmt.Sprintf("dial %s: connected", d.addr))
		}
	}
	return strings.Join(out, "; ")
}
