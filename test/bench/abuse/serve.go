package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"

	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// servingLine is the log line of `macfleet serve` with the address it serves.
var servingLine = regexp.MustCompile(`"msg"="Serving the OpenAI and admin API" "addr"="([^"]+)"`)

// servePhase runs `macfleet serve` with the fleet's model (named as the deployment)
// on a loopback port and measures the other client — at 127.0.0.1, as every local
// client of serve — alone, beside each of idleAttacks, and alone again: once with a
// new connection a request, once keeping one connection alive (as the SDKs do).
func servePhase(ctx context.Context, o options, fl *benchFleet) (oneShot, kept idleResult, err error) {
	url, pid, stop, err := startServe(ctx, o, fl)
	if err != nil {
		return oneShot, kept, err
	}
	defer stop()
	local := from("127.0.0.1", false, 1)
	if oneShot, err = attackPhase(ctx, o, "serve", url, pid, func() (time.Duration, string) { return timed(ctx, local, url, "") }); err != nil {
		return oneShot, kept, err
	}
	alive := from("127.0.0.1", true, 1)
	defer alive.CloseIdleConnections()
	kept, err = attackPhase(ctx, o, "serve, kept alive", url, pid, func() (time.Duration, string) { return timed(ctx, alive, url, "") })
	return oneShot, kept, err
}

// startServe starts `macfleet serve` and waits until it answers a chat completion:
// its URL, its process ID, and how to stop it.
func startServe(ctx context.Context, o options, fl *benchFleet) (url string, pid int, stop func(), err error) {
	dir := filepath.Join(fl.dir, "serve")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, nil, err
	}
	cmd := exec.CommandContext(ctx, o.macfleet, "serve", "--listen", "127.0.0.1:0", "--runner", o.runner, "--idle-timeout", "1h",
		"--prompt-cache-dir", filepath.Join(dir, "prompt-cache"),
		"--model", deployName+"="+filepath.Join(fl.f.ModelsDir, modelFile)+":ctx=2048,parallel=2,cache=off")
	cmd.Env = append(os.Environ(), "HOME="+dir)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("starting macfleet serve: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if url, err = servingAt(ctx, out); err != nil {
		return "", 0, nil, err
	}
	local := from("127.0.0.1", false, 1)
	deadline := time.Now().Add(2 * time.Minute)
	for { // the first request loads the model
		_, fail := timed(ctx, local, url, "")
		if fail == "" {
			break
		}
		if time.Now().After(deadline) {
			return "", 0, nil, fmt.Errorf("macfleet serve did not answer a chat completion in 2 minutes: %s", fail)
		}
		if err = sleep(ctx, 500*time.Millisecond); err != nil {
			return "", 0, nil, err
		}
	}
	return url, cmd.Process.Pid, stop, nil
}

// servingAt waits up to a minute for serve's log to name its address.
func servingAt(ctx context.Context, out *syncbuf.Buffer) (string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if m := servingLine.FindStringSubmatch(out.String()); m != nil {
			return "http://" + m[1], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("macfleet serve named no address in a minute; its log:\n%s", out.String())
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}
