package standalone

import (
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/internal/httpserver"
)

// TestCheck: what serve refuses before it starts, each refusal naming the flag.
func TestCheck(t *testing.T) {
	local := config.Config{Listen: "127.0.0.1:8080"}
	open := config.Config{Listen: "0.0.0.0:8080"}
	ok := Options{PromptCacheRetention: time.Hour, GCInterval: time.Minute, Limits: httpserver.Limits{MaxConnections: 1}}
	with := func(edit func(*Options)) Options {
		o := ok
		edit(&o)
		return o
	}
	tests := []struct {
		name     string
		cfg      config.Config
		opts     Options
		insecure bool
		err      string
	}{
		{name: "loopback without a key", cfg: local, opts: ok},
		{name: "every interface with a key", cfg: config.Config{Listen: "0.0.0.0:8080", APIKey: "k"}, opts: ok},
		{name: "every interface, insecure", cfg: open, opts: ok, insecure: true},
		{name: "every interface without a key", cfg: open, opts: ok, err: "--api-key"},
		{name: "negative retention", cfg: local, opts: with(func(o *Options) { o.PromptCacheRetention = -time.Second }),
			err: "--prompt-cache-retention and --gc-interval must not be negative"},
		{name: "negative interval", cfg: local, opts: with(func(o *Options) { o.GCInterval = -time.Second }),
			err: "--prompt-cache-retention and --gc-interval must not be negative"},
		{name: "an allowed host that is no name", cfg: local, opts: with(func(o *Options) { o.AllowedHosts = []string{"a b"} }),
			err: "--allowed-hosts: allowed host"},
		{name: "no connection", cfg: local, opts: with(func(o *Options) { o.Limits.MaxConnections = 0 }),
			err: "--max-connections must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.cfg, tt.opts, tt.insecure)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("error %v, want one containing %q", err, tt.err)
			}
		})
	}
}
