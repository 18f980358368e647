// Command macfleet is the single pure-Go binary of macfleet: the manager, the node
// agent, the gateway, the standalone server and the operator CLI are subcommands.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// root is the top-level command; every subcommand registers itself from its own file
// with root.AddCommand in an init function, so subcommands stay independent.
var root = &cobra.Command{
	Use:           "macfleet",
	Short:         "Run a fleet of Apple Silicon Macs as one pool of LLM capacity",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
