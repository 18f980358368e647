// Command devcluster runs a local kube-apiserver and etcd with the macfleet CRDs
// installed, for poking at the API with kubectl: `make dev-cluster` (hack/dev-cluster.sh)
// runs it from the repository root. It writes a kubeconfig, prints how to use it and
// runs until interrupted; the API server's data is discarded when it stops.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/test/support/testenv"
)

func main() {
	// controller-runtime already defines -kubeconfig (to read one).
	kubeconfig := flag.String("write-kubeconfig", ".cache/dev-cluster/kubeconfig", "where to write the kubeconfig")
	flag.Parse()
	if err := run(*kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "dev-cluster:", err)
		os.Exit(1)
	}
}

func run(kubeconfig string) error {
	kubeconfig, err := filepath.Abs(kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	env, err := testenv.New()
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "dev-cluster:", err)
		}
	}()
	if err := os.MkdirAll(filepath.Dir(kubeconfig), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	defer os.Remove(kubeconfig)

	fmt.Printf("API server %s up in %.1fs with the CRDs from %v\n",
		env.Config.Host, time.Since(start).Seconds(), env.CRDPaths)
	fmt.Printf("In another shell:\n\n  export KUBECONFIG=%s\n  kubectl apply -f config/samples/\n  kubectl get md,mr,mn\n\n", kubeconfig)
	fmt.Println("Ctrl-C stops it and discards its data.")
	<-ctx.Done()
	stop() // a second Ctrl-C kills at once
	fmt.Println("\nStopping")
	return nil
}
