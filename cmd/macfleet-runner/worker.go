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

	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/runner/llama"
	"github.com/macfleet/macfleet/runner/netdevice"
)

// runWorker is `macfleet-runner worker`: it holds some of a model's layers for a
// runner started with --split-worker (docs/split-model.md), serving one runner at a
// time until SIGTERM, which ends the session it is serving.
func runWorker(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("macfleet-runner worker", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "serve runners on this TCP address (port 0 picks one)")
	model := fs.String("model", "", "this Mac's copy of the GGUF model file (required): the runner's must be identical")
	device := fs.String("device", string(netdevice.DeviceAuto), "the device computing the layers: "+
		"auto (the first GPU ggml has, Metal on a Mac, else the CPU), cpu, or gpu (fails without one)")
	threads := fs.Int("threads", max(1, runtime.NumCPU()-1), "CPU threads computing the layers (on the CPU device)")
	memory := fs.Int64("memory", 0, "bytes the worker answers the runner as its free and total memory: "+
		"its shard's reservation on this Mac (default: the device's: the Mac's physical memory on the CPU, "+
		"the memory Metal may use on the GPU)")
	verbose := fs.BoolP("verbose", "v", false, "log ggml's info messages")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "macfleet-runner worker:", err)
		return exitBadFlags
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "macfleet-runner worker: unexpected arguments %q\n", fs.Args())
		return exitBadFlags
	case *listen == "" || *model == "":
		fmt.Fprintln(stderr, "macfleet-runner worker: --listen and --model are required")
		return exitBadFlags
	case *threads < 1:
		fmt.Fprintln(stderr, "macfleet-runner worker: --threads must be positive")
		return exitBadFlags
	case *memory < 0:
		fmt.Fprintln(stderr, "macfleet-runner worker: --memory must not be negative")
		return exitBadFlags
	}
	choice, err := netdevice.ParseDeviceChoice(*device)
	if err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker: --device:", err)
		return exitBadFlags
	}
	if _, err := os.Stat(*model); err != nil {
		fmt.Fprintln(stderr, "macfleet-runner worker:", err)
		return exitLoadFailed
	}
	llama.Init(*verbose)
	dev, err := netdevice.WorkerDevice(choice)
	if err != nil {
		fmt.Fprintf(stderr, "macfleet-runner worker: --device %s: %v\n", choice, err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "macfleet-runner worker: computing on %s (%s)\n", dev.Name, dev.Type)
	ln, err := net.Listen("tcp", *listen)
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
	for {
		conn, err := ln.Accept()
		if err != nil {
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
		err = netdevice.Serve(ctx, conn.(*net.TCPConn), *model, choice, *threads, *memory)
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
