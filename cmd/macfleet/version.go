package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/internal/version"
)

func init() {
	root.AddCommand(newVersionCommand())
	root.Version = version.Get().String()
	root.SetVersionTemplate("macfleet {{.Version}}\n")
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version this binary was built with",
		Long: "Prints the release this binary was built from (stamped by `make` from `git describe`; " +
			"\"dev\" for a plain `go build`), its commit, the Go toolchain and the platform. " +
			"docs/upgrading.md says which manager, agent and runner versions work together.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "":
				_, err := fmt.Fprintln(cmd.OutOrStdout(), "macfleet", info)
				return err
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			default:
				return fmt.Errorf("--output %q: want json or nothing", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: print the build as a JSON object")
	return cmd
}
