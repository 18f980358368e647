package main

import (
	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/agent/launchd"
)

// newServeInstallCmd is `macfleet serve install`; the serve command adds it.
func newServeInstallCmd() *cobra.Command {
	return newInstallCmd(launchd.Serve, &cobra.Command{
		Use:   "install [--system] [--dry-run] -- SERVE-FLAGS...",
		Short: "Install `macfleet serve` as a launchd service on this Mac",
		Long: `Write a launchd property list that runs "macfleet serve" with the flags given after
--, keeps it alive (restarted if it exits, started at login, or at boot with --system)
and logs to ~/Library/Logs/macfleet/serve.log and serve.err.log, then load it with
"launchctl bootstrap", replacing a loaded older one. Models given as sources are pulled
into ~/Library/Application Support/macfleet/models unless --store-dir is given; the
prompt cache lives beside them unless --prompt-cache-dir is.

The service is a LaunchAgent of the current user (~/Library/LaunchAgents), or with
--system a LaunchDaemon of the machine (/Library/LaunchDaemons, logs in
/Library/Logs/macfleet; needs sudo), which starts at boot without anyone logging in,
as the account --user names (default: who ran sudo).
Relative paths in the flags are made absolute; model files must be given by absolute
path. --api-key is refused (the property list is readable by every user): use
--api-key-file. --env values (a hub token, a proxy's credentials) go to serve.env in
the data directory, a file only you can read (mode 0600) that the service loads with
--env-file, never into the property list. --dry-run prints the property list instead,
on any operating system.`,
		Example: "  macfleet serve install -- --model qwen=hf://Qwen/Qwen2.5-Coder-7B-Instruct-GGUF/qwen2.5-coder-7b-instruct-q4_k_m.gguf:ctx=32768\n" +
			"  macfleet serve install --env HF_TOKEN=hf_… -- --model gated=hf://org/gated/m.gguf\n" +
			"  sudo macfleet serve install --system -- --model chat=/opt/models/chat.gguf --listen 0.0.0.0:8080 --api-key-file /etc/macfleet/key\n" +
			"  tail -f ~/Library/Logs/macfleet/serve.err.log",
	})
}
