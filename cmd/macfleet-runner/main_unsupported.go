//go:build !cgo || race

// Command macfleet-runner needs cgo (it links llama.cpp) and is never built with the
// race detector; build it with hack/build-runner.sh. This stub keeps `go build ./...`
// and `go test -race ./...` working without compiling llama.cpp.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "macfleet-runner: this build has no llama.cpp (it needs cgo and no -race); build it with hack/build-runner.sh")
	os.Exit(2)
}
