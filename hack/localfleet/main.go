// Command localfleet runs a whole macfleet on this machine for `make demo`: kube-apiserver
// and etcd, the manager, the gateway, two agents simulating Macs with different memory
// ceilings, and an HTTP server holding a synthesized model (test/support/localfleet). Once
// the fleet is up it writes an env file (KUBECONFIG, GATEWAY, ...) that hack/demo.sh
// sources, and runs until interrupted.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testassets"
)

func main() {
	var (
		dir     = flag.String("dir", ".cache/demo/fleet", "directory for kubeconfigs, logs, model stores and models")
		binary  = flag.String("binary", "bin/macfleet", "the macfleet executable")
		runner  = flag.String("runner", "bin/macfleet-runner", "the runner executable")
		envFile = flag.String("env-file", ".cache/demo/fleet.env", "written once the fleet is up")
		models  = flag.String("models-addr", "127.0.0.1:18090", "where the model server listens (config/samples/ name it)")
	)
	flag.Parse()
	if err := run(*dir, *binary, *runner, *envFile, *models); err != nil {
		fmt.Fprintln(os.Stderr, "localfleet:", err)
		os.Exit(1)
	}
}

func run(dir, binary, runner, envFile, modelsAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_ = os.Remove(envFile)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	start := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// The gateway runs as the chart runs it by default: every request needs a key, a
	// team's key (a Secret in its namespace) or the operator's admin key written here.
	adminKey, err := newKey()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keysFile := filepath.Join(dir, "admin-keys")
	if err := os.WriteFile(keysFile, []byte(adminKey+"\n"), 0o600); err != nil {
		return err
	}
	fleet, err := localfleet.Start(startCtx, localfleet.Options{Binary: binary, Runner: runner, Dir: dir, ModelsAddr: modelsAddr, Log: os.Stdout,
		GatewayArgs: []string{"--tenant-keys", "--api-keys-file", keysFile}})
	if err != nil {
		return err
	}
	defer fleet.Stop()

	// The model the samples in config/samples/ name: the small trained test model
	// (docs/testing.md), the real Llama 3 vocabulary and Llama 3.1 chat template with
	// weights trained to greet, call the tool a question needs and answer from its
	// result; without it in the checkout, random weights of the same vocabulary and
	// template. Served by the fleet's model server as a model hub would serve a real one.
	trained, err := testassets.WriteChatModel(filepath.Join(fleet.ModelsDir, "tiny-chat.gguf"))
	if err != nil {
		return err
	}
	if !trained {
		fmt.Println("The trained test model is not in this checkout: tiny-chat has random weights")
	}
	// The coding agents' model (config/samples/coder.yaml): the same vocabulary and
	// template with a 32k context, steered to answer "Hi" and end its turn, so Claude
	// Code and Codex CLI complete a turn against the demo.
	coder, err := testassets.CoderSpec()
	if err != nil {
		return err
	}
	if err := ggufsynth.Write(filepath.Join(fleet.ModelsDir, "coder.gguf"), coder); err != nil {
		return err
	}

	// The vision sample (config/samples/tiny-vision.yaml): a tiny Gemma 3-shaped model
	// and its synthesized projector.
	if err := writeVisionModel(fleet.ModelsDir); err != nil {
		return err
	}
	// The mixture-of-experts sample (config/samples/tiny-moe.yaml): a tiny
	// Qwen3-Coder-shaped model stored as three files, as hubs store large models.
	moe, err := ggufsynth.TinyFamily(ggufsynth.Qwen3MoE)
	if err != nil {
		return err
	}
	if _, err := ggufsynth.WriteParts(filepath.Join(fleet.ModelsDir, "tiny-moe"), moe, 3); err != nil {
		return err
	}

	env := fmt.Sprintf("KUBECONFIG=%s\nGATEWAY=%s\nADMIN_KEY=%s\nMODELS_URL=%s\nLOGS=%s\n",
		fleet.AdminKubeconfig, fleet.GatewayURL, adminKey, fleet.ModelsURL, fleet.LogDir())
	if err := os.WriteFile(envFile+".tmp", []byte(env), 0o600); err != nil {
		return err
	}
	if err := os.Rename(envFile+".tmp", envFile); err != nil {
		return err
	}
	fmt.Printf("Fleet up in %.1fs\n", time.Since(start).Seconds())
	<-ctx.Done()
	stop() // a second Ctrl-C kills at once
	fmt.Println("\nStopping the fleet")
	return nil
}

// writeVisionModel writes the vision sample's model and projector into dir.
func writeVisionModel(dir string) error {
	spec, err := ggufsynth.TinyFamily(ggufsynth.Gemma3)
	if err != nil {
		return err
	}
	proj, err := ggufsynth.TinyProjector(spec)
	if err != nil {
		return err
	}
	if err := ggufsynth.Write(filepath.Join(dir, "tiny-vision.gguf"), spec); err != nil {
		return err
	}
	return ggufsynth.WriteProjector(filepath.Join(dir, "tiny-vision-mmproj.gguf"), proj)
}

// newKey is a random API key.
func newKey() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
