//go:build cgo && !race

package main

import (
	"fmt"
	"io"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/server"
)

// readSplitTokens reads --split-tokens-stdin: one token per split worker, in order,
// each runnerapi.SplitSecretBytes in hex and a newline (out of the command line and
// environment, which other processes of the Mac can read).
func readSplitTokens(workers []server.SplitWorker, r io.Reader) error {
	for i := range workers {
		token, err := runnerapi.ReadWorkerSecret(r)
		if err != nil {
			return fmt.Errorf("--split-tokens-stdin, the token of %s: %w", workers[i].Addr, err)
		}
		workers[i].Token = token
	}
	return nil
}
