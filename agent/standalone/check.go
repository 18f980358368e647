package standalone

import (
	"errors"
	"fmt"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/internal/httpserver"
)

// Check refuses, before anything starts, what `macfleet serve` must not run with
// beyond its configuration (config.Resolve checks that): negative prune durations, an
// API without a key that other machines reach unless insecure (CheckExposure),
// allowed hosts the API cannot check (httpserver.NewHosts), and fewer than one
// connection (opts.Limits.MaxConnections is the --max-connections flag's here; Run
// itself takes 0 as the default). Each error names the flag.
func Check(cfg config.Config, opts Options, insecure bool) error {
	if opts.PromptCacheRetention < 0 || opts.GCInterval < 0 {
		return errors.New("--prompt-cache-retention and --gc-interval must not be negative")
	}
	if err := CheckExposure(cfg.Listen, cfg.APIKey != "", insecure); err != nil {
		return err
	}
	if _, err := httpserver.NewHosts(cfg.Listen, opts.AllowedHosts); err != nil {
		return fmt.Errorf("--allowed-hosts: %w", err)
	}
	if opts.Limits.MaxConnections < 1 {
		return errors.New("--max-connections must be at least 1")
	}
	return nil
}
