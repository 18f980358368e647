//go:build cgo && !race

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// runWorker is `macfleet-runner worker`: it holds some of a model's layers for a
// runner started with --split-worker (docs/split-model.md), serving one runner at a
// time until SIGTERM, which ends the session it is serving.
func runWorker(args []string, stdout, stderr io.Writer) int {
	f, code, ok := parseWorkerFlags(args, stderr)
	if !ok {
		return code
	}
	secret, ok := workerSecret(f.secretStdin, stderr)
	if !ok {
		return exitBadFlags
	}
	choice, err := netdevice.ParseDeviceChoice(f.device)
	if err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker: --device:", err)
		return exitBadFlags
	}
	if _, err := os.Stat(f.model); err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker:", err)
		return exitLoadFailed
	}
	fmt.Fprintf(stderr, "macfleet-runner worker: %s\n", llama.LoadBackends(f.backendDir).Summary())
	llama.Init(f.verbose)
	dev, err := netdevice.WorkerDevice(choice)
	if err != nil {
		fmt.Fprintf(stderr, "macfleet-runner worker: --device %s: %v\n", choice, err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "macfleet-runner worker: computing on %s (%s)\n", dev.Name, dev.Type)
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker:", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	line, _ := json.Marshal(runnerapi.ListeningEvent{Event: "listening", Addr: ln.Addr().String(), PID: os.Getpid()})
	fmt.Fprintf(stdout, "%s\n", line)
	return serveSessions(ctx, ln, session{model: f.model, choice: choice, threads: f.threads, memory: f.memory, next: f.next, secret: secret,
		idle: f.idle}, stderr)
}

// workerFlags are `macfleet-runner worker`'s flags.
type workerFlags struct {
	listen, model, device, next, backendDir string
	threads                                 int
	memory                                  int64
	secretStdin, verbose                    bool
	idle                                    time.Duration
}

// parseWorkerFlags parses and checks the worker's flags; when it fails (false), code is
// the exit code (exitOK after --help).
func parseWorkerFlags(args []string, stderr io.Writer) (f workerFlags, code int, ok bool) {
	fs := pflag.NewFlagSet("macfleet-runner worker", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.listen, "listen", "", "serve runners on this TCP address (port 0 picks one)")
	fs.StringVar(&f.model, "model", "", "this Mac's copy of the GGUF model file (required): the runner's must be identical")
	fs.StringVar(&f.device, "device", string(netdevice.DeviceAuto), "the device computing the layers: "+
		"auto (the first GPU ggml has, Metal on a Mac, else the CPU), cpu, or gpu (fails without one)")
	fs.IntVar(&f.threads, "threads", max(1, runtime.NumCPU()-1), "CPU threads computing the layers (on the CPU device)")
	fs.Int64Var(&f.memory, "memory", 0, "bytes the worker answers the runner as its free and total memory: "+
		"its shard's reservation on this Mac (default: the device's: the Mac's physical memory on the CPU, "+
		"the memory Metal may use on the GPU)")
	fs.StringVar(&f.next, "next", "", "the address at which this worker reaches the worker of the next shard (its --listen address, "+
		"or a forward to it): the hidden state after this worker's layers then goes straight there, not through the runner "+
		"(docs/split-model.md, Worker to worker)")
	fs.BoolVar(&f.secretStdin, "secret-stdin", false, "read a secret from standard input (64 hex digits and a newline) that every "+
		"connection must open with, before any byte of the worker protocol (docs/split-model.md); the agent starts its workers so")
	fs.DurationVar(&f.idle, "idle-timeout", defaultIdleTimeout, "end a runner's session after this long without a command (0: never): "+
		"a runner keeps its link alive with a STATUS a third of the way, so only a link whose runner is gone or stuck idles out")
	fs.StringVar(&f.backendDir, "backend-dir", defaultBackendDir(), backendDirUsage)
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "log ggml's info messages")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return f, exitOK, false
		}
		fmt.Fprintln(stderr, "macfleet-runner worker:", err)
		return f, exitBadFlags, false
	}
	if msg := f.problem(fs.Args()); msg != "" {
		fmt.Fprintln(stderr, "macfleet-runner worker:", msg)
		return f, exitBadFlags, false
	}
	return f, exitOK, true
}

// problem says what is wrong with the flags and the arguments left after them ("" when
// nothing is).
func (f workerFlags) problem(rest []string) string {
	switch {
	case len(rest) > 0:
		return fmt.Sprintf("unexpected arguments %q", rest)
	case f.listen == "" || f.model == "":
		return "--listen and --model are required"
	case f.threads < 1:
		return "--threads must be positive"
	case f.memory < 0:
		return "--memory must not be negative"
	case f.idle < 0 || (f.idle > 0 && f.idle < time.Second) || f.idle > 24*time.Hour:
		return "--idle-timeout must be 0 (never) or between 1s and 24h"
	}
	return ""
}

// workerSecret reads the secret every connection must open with (runnerapi.SplitAuth)
// from standard input when fromStdin, else warns that connections go unauthenticated
// and returns nil; false when the secret could not be read.
func workerSecret(fromStdin bool, stderr io.Writer) ([]byte, bool) {
	if !fromStdin {
		fmt.Fprintln(stderr, "macfleet-runner worker: no --secret-stdin: every connection to --listen is served "+
			"unauthenticated (the agent always starts its workers with a secret)")
		return nil, true
	}
	secret, err := runnerapi.ReadWorkerSecret(os.Stdin)
	if err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker: --secret-stdin:", err)
		return nil, false
	}
	return secret, true
}

// defaultIdleTimeout is --idle-timeout's default: far above a runner's keepalive (a
// third of it), short enough that a stuck or vanished runner frees the worker soon.
const defaultIdleTimeout = 2 * time.Minute

// session is what the worker serves each runner with: its model file, device, threads,
// memory and --next, the secret every connection must open with (nil: none) and the
// idle timeout of a session.
type session struct {
	model   string
	choice  netdevice.DeviceChoice
	threads int
	memory  int64
	next    string
	secret  []byte
	idle    time.Duration
}

// authTimeout bounds the wait for a connection's authentication frame.
const authTimeout = 10 * time.Second

// serveSessions serves the runners that connect to ln, one at a time, until ctx ends or
// ln fails; it returns the worker's exit code.
func serveSessions(ctx context.Context, ln net.Listener, w session, stderr io.Writer) int {
	// Every connection is either a runner's session, served one at a time below, or a
	// previous worker's peer link, which joins the session being served: the listener
	// keeps accepting while a session runs.
	runners := make(chan *net.TCPConn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			go sortConn(ctx, conn.(*net.TCPConn), w.secret, runners, stderr)
		}
	}()
	for {
		var conn *net.TCPConn
		select {
		case conn = <-runners:
		case err := <-acceptErr:
			if ctx.Err() != nil {
				return exitOK
			}
			fmt.Fprintln(stderr, "macfleet-runner worker:", err)
			return exitFailed
		}
		remote := conn.RemoteAddr().String()
		fmt.Fprintf(stderr, "macfleet-runner worker: serving the runner at %s\n", remote)
		// One runner at a time: its buffers are freed when it disconnects or a signal
		// ends its session (the runner then fails its requests: its worker is lost).
		err := netdevice.Serve(ctx, conn, w.model, w.choice, w.threads, w.memory, w.next, w.idle)
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(stderr, "macfleet-runner worker: stopping: ended the session with the runner at %s\n", remote)
			return exitOK
		case err != nil:
			fmt.Fprintf(stderr, "macfleet-runner worker: the runner at %s: %v\n", remote, err)
		default:
			fmt.Fprintf(stderr, "macfleet-runner worker: the runner at %s disconnected\n", remote)
		}
	}
}

// sortConn hands a new connection to the session loop (a runner) or to the session
// being served (a previous worker's peer link), by its first frame; with a secret,
// only once the connection has presented it (runnerapi.ReadSplitAuth): any other
// connection is closed before the worker protocol reads a byte of it.
func sortConn(ctx context.Context, conn *net.TCPConn, secret []byte, runners chan<- *net.TCPConn, stderr io.Writer) {
	remote := conn.RemoteAddr().String()
	if secret != nil {
		_ = conn.SetReadDeadline(time.Now().Add(authTimeout))
		err := runnerapi.ReadSplitAuth(conn, secret)
		_ = conn.SetReadDeadline(time.Time{})
		if err != nil {
			fmt.Fprintf(stderr, "macfleet-runner worker: refused the connection from %s: %v\n", remote, err)
			conn.Close()
			return
		}
	}
	peer, err := netdevice.IsPeerLink(conn, 10*time.Second)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "macfleet-runner worker: closed the connection from %s: %v\n", remote, err)
		conn.Close()
	case peer:
		if err := netdevice.AcceptPeer(conn); err != nil {
			fmt.Fprintf(stderr, "macfleet-runner worker: the peer link from %s: %v\n", remote, err)
			return
		}
		fmt.Fprintf(stderr, "macfleet-runner worker: accepted the peer link from %s (the previous shard's worker)\n", remote)
	default:
		select {
		case runners <- conn:
		case <-ctx.Done():
			conn.Close()
		}
	}
}
