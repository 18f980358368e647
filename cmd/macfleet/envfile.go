package main

import (
	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/agent/launchd"
)

// envFile is the value of --env-file, a flag of every command: the file of KEY=VALUE
// lines that `serve install` and `agent install` write (mode 0600) for --env, which
// the service reads at start instead of a property list every user can read.
var envFile string

func init() {
	root.PersistentFlags().StringVar(&envFile, "env-file", "",
		"file of KEY=VALUE lines to set in the environment before the command runs (what serve install --env and agent install --env write, mode 0600)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if envFile == "" {
			return nil
		}
		return launchd.LoadEnvFile(envFile)
	}
}
