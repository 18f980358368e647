package clustermode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/internal/tunnel"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// Options are the settings of `macfleet agent` as its command line gives them, one
// field per flag (named in the errors): cmd/macfleet binds its flags to them and
// parses the sizes, Config applies the defaults and checks them, and CreateDirs makes
// the directories.
type Options struct {
	// NodeName is the MacNode's name (--node-name); required.
	NodeName string
	// Listen and AdvertiseAddress: see Config.
	Listen, AdvertiseAddress string
	// Connect (--connect) is how the fleet reaches the agent: "inbound" at its
	// advertised address, "outbound" through the connection it holds to the gateway's
	// tunnel listener at GatewayTunnel (--gateway-tunnel), which it needs, "auto"
	// through that connection while the gateway does not reach its address; unset,
	// auto with GatewayTunnel and inbound without (ParseConnect).
	Connect, GatewayTunnel string
	// TunnelProbeInterval (--tunnel-probe-interval), with --connect auto, is how
	// often the agent asks the gateway again whether it reaches the agent's address
	// while it holds no tunnel (tunnel.ProbeInterval when zero; at least
	// tunnel.MinProbeInterval).
	TunnelProbeInterval time.Duration
	// StoreDir (--store-dir) is the model store, StateDir (--state-dir) the agent's
	// own state; both required, and created by CreateDirs.
	StoreDir, StateDir string
	// PromptCacheDir (--prompt-cache-dir) is made absolute; empty: no SSD tier.
	PromptCacheDir string
	// CeilingBytes and ReserveBytes: see enginepool.Config (0: the Mac's).
	CeilingBytes, ReserveBytes int64
	// PromptCacheHotBytes (--prompt-cache-hot-bytes) is the hot budget shared by the
	// replicas: unset a tenth of the ceiling, 0 no hot tier. PromptCacheSSDBytes
	// (--prompt-cache-ssd-bytes) is the SSD quota of each model of each namespace,
	// shared by its replicas on this Mac (one directory): unset
	// config.DefaultPromptCacheSSDBytes, 0 no SSD tier.
	PromptCacheHotBytes, PromptCacheSSDBytes *config.Size
	// RunnerPath, RunnerThreads and KeepRunners: see Config. RunnerSandbox is "on"
	// or "off" (--runner-sandbox).
	RunnerPath    string
	RunnerThreads int
	RunnerSandbox string
	KeepRunners   bool
	// AllowUnconfinedRunners (--allow-unconfined-runners): see Config.
	AllowUnconfinedRunners bool
	// StoreRetention, PromptCacheRetention and GCInterval are the janitor's
	// (janitor.Options); none may be negative.
	StoreRetention, PromptCacheRetention, GCInterval time.Duration
	// TokenAudience, TokenIssuer, NoServiceAccountTokens and TokenCacheTTL: see Config.
	TokenAudience          string
	TokenIssuer            string
	NoServiceAccountTokens bool
	TokenCacheTTL          time.Duration
}

// Config is the agent's configuration for o, without what the caller wires in (the
// rest config, the store, the gauge, tracing, the log): the prompt cache's defaults
// (Options.PromptCacheHotBytes, PromptCacheSSDBytes) applied, the prompt cache
// directory made absolute, and the first invalid setting an error naming its flag.
func (o Options) Config() (Config, error) {
	if o.NodeName == "" {
		return Config{}, errors.New("--node-name is required (the hostname is not available)")
	}
	cfg := Config{NodeName: o.NodeName, Listen: o.Listen, AdvertiseAddress: o.AdvertiseAddress,
		RunnerPath: o.RunnerPath, RunnerThreads: o.RunnerThreads, StateDir: o.StateDir, KeepRunners: o.KeepRunners,
		TokenAudience: o.TokenAudience, TokenIssuer: o.TokenIssuer, NoServiceAccountTokens: o.NoServiceAccountTokens, TokenCacheTTL: o.TokenCacheTTL,
		PromptCacheSSDBytes: standalone.PromptCacheSSDBytes(o.PromptCacheSSDBytes)}
	cfg.Pool.CeilingBytes, cfg.Pool.ReserveBytes = o.CeilingBytes, o.ReserveBytes
	conn, err := ParseConnect(o.Connect, o.GatewayTunnel)
	if err != nil {
		return cfg, err
	}
	cfg.GatewayTunnel, cfg.ConnectAuto = conn.Tunnel, conn.Auto
	if cfg.TunnelProbeInterval, err = probeInterval(o.TunnelProbeInterval, conn.Auto); err != nil {
		return cfg, err
	}
	cfg.Pool.PromptCacheHotBytes = standalone.PromptCacheHotBytes(o.PromptCacheHotBytes)
	if o.PromptCacheDir != "" {
		dir, err := filepath.Abs(o.PromptCacheDir)
		if err != nil {
			return cfg, fmt.Errorf("--prompt-cache-dir: %w", err)
		}
		cfg.PromptCacheDir = dir
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"store-retention", o.StoreRetention}, {"prompt-cache-retention", o.PromptCacheRetention}, {"gc-interval", o.GCInterval}} {
		if d.v < 0 {
			return cfg, fmt.Errorf("--%s: %s is negative", d.name, d.v)
		}
	}
	cfg.Janitor = janitor.Options{StoreRetention: o.StoreRetention, PromptCacheRetention: o.PromptCacheRetention,
		Interval: o.GCInterval}
	for _, d := range o.dirs() {
		if d.dir == "" {
			return cfg, fmt.Errorf("--%s is required (no home directory to default to)", d.flag)
		}
	}
	mode, err := sandbox.ParseMode(o.RunnerSandbox)
	if err != nil {
		return cfg, fmt.Errorf("--runner-sandbox: %w", err)
	}
	cfg.RunnerSandbox, cfg.AllowUnconfinedRunners = mode, o.AllowUnconfinedRunners
	return cfg, nil
}

// Connect modes (--connect).
const (
	ConnectInbound  = "inbound"
	ConnectOutbound = "outbound"
	ConnectAuto     = "auto"
)

// Connection is how the fleet reaches the agent: Tunnel is the gateway tunnel it
// dials ("" none), held always, or with Auto only while the gateway's probe does not
// reach the agent at its advertised address (tunnel.ChooseOutbound).
type Connection struct {
	Tunnel string
	Auto   bool
}

// ParseConnect decides --connect and --gateway-tunnel (addr). Unset, it is auto with
// a tunnel address and inbound without one.
func ParseConnect(connect, addr string) (Connection, error) {
	switch connect {
	case "":
		if addr == "" {
			return Connection{}, nil
		}
		connect = ConnectAuto
	case ConnectInbound:
		if addr != "" {
			return Connection{}, errors.New("--gateway-tunnel is for --connect outbound or auto (the agent dials the gateway); drop --connect inbound or --gateway-tunnel")
		}
		return Connection{}, nil
	case ConnectOutbound, ConnectAuto:
		if addr == "" {
			return Connection{}, fmt.Errorf("--connect %s needs --gateway-tunnel HOST:PORT, the address of the gateway's --tunnel-listen", connect)
		}
	default:
		return Connection{}, fmt.Errorf("--connect %q: want %s, %s or %s", connect, ConnectInbound, ConnectOutbound, ConnectAuto)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return Connection{}, fmt.Errorf("--gateway-tunnel %q: want HOST:PORT: %w", addr, err)
	}
	return Connection{Tunnel: addr, Auto: connect == ConnectAuto}, nil
}

// probeInterval checks --tunnel-probe-interval d (0: unset) for a connection that
// is auto or not.
func probeInterval(d time.Duration, auto bool) (time.Duration, error) {
	switch {
	case d == 0:
		return 0, nil
	case !auto:
		return 0, errors.New("--tunnel-probe-interval is for --connect auto (an agent that probes whether the gateway reaches it); drop it")
	case d < tunnel.MinProbeInterval:
		return 0, fmt.Errorf("--tunnel-probe-interval %s: want at least %s (the gateway answers a failed probe after that long)", d, tunnel.MinProbeInterval)
	}
	return d, nil
}

// CreateDirs creates the store and state directories (Config checked they are set).
func (o Options) CreateDirs() error {
	for _, d := range o.dirs() {
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return fmt.Errorf("--%s: %w", d.flag, err)
		}
	}
	return nil
}

// dirs are the directories the agent needs, with their flags.
func (o Options) dirs() []struct{ flag, dir string } {
	return []struct{ flag, dir string }{{"store-dir", o.StoreDir}, {"state-dir", o.StateDir}}
}
