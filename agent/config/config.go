// Package config is the configuration of a standalone node agent (`macfleet serve`):
// the models it serves (name → GGUF path and engine settings), its memory ceiling, its
// listen address and API key. It is read from a YAML file and from flags, flags
// winning, and validated as a whole so every mistake is reported at once with the
// field it concerns.
package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// Defaults.
const (
	DefaultListen       = "127.0.0.1:8080"
	DefaultMaxBodyBytes = 16 << 20
	// MaxModelNameLength bounds model names and aliases.
	MaxModelNameLength = 128
	// DefaultPromptCacheSSDBytes is each model's prompt cache SSD quota when the
	// agent sets none.
	DefaultPromptCacheSSDBytes = 10 << 30
)

// Residency values (the same strings as enginepool.Residency).
const (
	ResidencyOnDemand = "OnDemand"
	ResidencyResident = "Resident"
	ResidencyPinned   = "Pinned"
)

// Config is the whole agent configuration. The YAML file uses the lowerCamel field
// names below; sizes are Kubernetes quantities ("12Gi", "512Mi", "2G") or bytes.
type Config struct {
	// Listen is the address of the OpenAI and admin API (host:port).
	Listen string `json:"listen,omitempty"`
	// APIKey, when set, is required as "Authorization: Bearer KEY" on every endpoint
	// but /healthz and /readyz. APIKeyFile reads it from a file instead.
	APIKey     string `json:"apiKey,omitempty"`
	APIKeyFile string `json:"apiKeyFile,omitempty"`
	// Runner is the macfleet-runner binary; empty means $MACFLEET_RUNNER, else next to
	// the macfleet binary, else on $PATH.
	Runner string `json:"runner,omitempty"`
	// RunnerThreads is the CPU threads of each runner whose model sets none (0: the
	// thread policy, engine.PolicyThreads, chooses).
	RunnerThreads int `json:"runnerThreads,omitempty"`
	// RunnerSandbox confines each runner (metal/runner/sandbox): "on" (the default) or "off".
	RunnerSandbox string `json:"runnerSandbox,omitempty"`
	// AllowUnconfinedRunners lets runners start unconfined where the sandbox is on but
	// this machine cannot enforce it (no Landlock, no sandbox-exec); without it they
	// are refused.
	AllowUnconfinedRunners bool `json:"allowUnconfinedRunners,omitempty"`
	// MemoryCeiling caps the pool below the machine's own ceiling (0: none).
	MemoryCeiling Size `json:"memoryCeiling,omitempty"`
	// MemoryReserve is what the static ceiling leaves to the OS (0: 4 GiB below 24 GiB
	// of memory, else 6 GiB).
	MemoryReserve Size `json:"memoryReserve,omitempty"`
	// IdleTimeout is the default idle timeout of OnDemand models (0: 5m; negative:
	// never).
	IdleTimeout Duration `json:"idleTimeout,omitempty"`
	// MaxBodyBytes bounds request bodies (0: 16 MiB).
	MaxBodyBytes Size `json:"maxBodyBytes,omitempty"`
	// PromptCacheDir is the root of the prompt cache's SSD tier: each model's runner
	// keeps its states in a directory below it named by the model file, so a
	// restarted agent finds them again. Empty: no SSD tier (`macfleet serve` defaults
	// it to the agent's data directory).
	PromptCacheDir string `json:"promptCacheDir,omitempty"`
	// PromptCacheHotBytes is the prompt cache hot (memory) budget shared by all
	// runners (unset: a tenth of the memory ceiling; 0: no hot tier).
	PromptCacheHotBytes *Size `json:"promptCacheHotBytes,omitempty"`
	// PromptCacheSSDBytes is each model's SSD quota and the most a model may ask for
	// (unset: DefaultPromptCacheSSDBytes; 0: no SSD tier).
	PromptCacheSSDBytes *Size `json:"promptCacheSSDBytes,omitempty"`
	// Models are the models served, in order.
	Models []Model `json:"models,omitempty"`
}

// Model is one served model.
type Model struct {
	// Name is the OpenAI "model" value clients use.
	Name string `json:"name"`
	// Aliases are further names for the same model.
	Aliases []string `json:"aliases,omitempty"`
	// Path is the local GGUF file. `macfleet serve` also takes a model source here
	// (hf://, ollama://, https://), which it pulls into its model store and replaces
	// with the stored file's path before anything else reads the configuration.
	Path string `json:"path"`
	// SHA256 is the digest a pulled source's file must have (hex); unset, an hf:// or
	// https:// file is checked only for the GGUF magic, an ollama:// one against its
	// manifest's digest.
	SHA256 string `json:"sha256,omitempty"`
	// Projector is the model's multimodal projector (an mmproj GGUF file; `macfleet
	// serve` also takes a source, pulled as Path is): its runner answers images with it.
	Projector string `json:"projector,omitempty"`
	// Draft is the model's draft model for speculative decoding (a smaller GGUF of
	// the same vocabulary; `macfleet serve` also takes a source, pulled as Path is):
	// its runner drafts with it (docs/speculative-decoding.md).
	Draft string `json:"draft,omitempty"`
	// Settings are the engine settings (contextLength, parallel, kvCacheType, threads)
	// as in a ModelDeployment, with the same bounds. An unset contextLength gives every
	// slot the model's training context.
	engine.Settings `json:",inline"`
	// Residency is OnDemand (default), Resident or Pinned.
	Residency string `json:"residency,omitempty"`
	// IdleTimeout overrides the agent's default for this model.
	IdleTimeout Duration `json:"idleTimeout,omitempty"`
	// Memory overrides the memory estimate read from the GGUF header.
	Memory Size `json:"memory,omitempty"`
	// PromptCache configures the model's prompt cache (unset: enabled with the
	// agent's settings).
	PromptCache *PromptCache `json:"promptCache,omitempty"`
}

// PromptCache is one model's prompt cache settings. The agent's settings bound them.
type PromptCache struct {
	// Enabled turns the prompt cache on or off (unset: on).
	Enabled *bool `json:"enabled,omitempty"`
	// HotBytes caps the model's share of the agent's hot budget (unset: no cap of
	// its own; 0: no hot tier).
	HotBytes *Size `json:"hotBytes,omitempty"`
	// SSDBytes is the model's SSD quota, at most the agent's (unset: the agent's;
	// 0: no SSD tier).
	SSDBytes *Size `json:"ssdBytes,omitempty"`
}

// IsEnabled says whether the cache is on (it is unless set off).
func (p *PromptCache) IsEnabled() bool { return p == nil || p.Enabled == nil || *p.Enabled }

// Size is a byte count written as a Kubernetes quantity or a plain integer.
type Size int64

// ParseSize parses "12Gi", "512Mi", "2G", "1048576" or "0".
func ParseSize(s string) (Size, error) {
	s = strings.TrimSpace(s)
	// Accept the common "GiB"/"MiB" spellings too.
	for _, suf := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if strings.HasSuffix(s, suf) {
			s = strings.TrimSuffix(s, "B")
			break
		}
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (use bytes or a quantity such as 512Mi, 12Gi or 2G)", s)
	}
	v := q.Value() // rounded up
	if q.Cmp(*resource.NewQuantity(v, resource.DecimalSI)) != 0 {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	return Size(v), nil
}

// UnmarshalJSON accepts a quantity string or a number.
func (s *Size) UnmarshalJSON(b []byte) error {
	str := strings.Trim(string(b), `"`)
	if str == "null" || str == "" {
		*s = 0
		return nil
	}
	v, err := ParseSize(str)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalJSON writes the byte count as a number.
func (s Size) MarshalJSON() ([]byte, error) { return []byte(strconv.FormatInt(int64(s), 10)), nil }

// String renders the size as a quantity ("12Gi").
func (s Size) String() string { return resource.NewQuantity(int64(s), resource.BinarySI).String() }

// Duration is a time.Duration written as "5m" or "90s".
type Duration time.Duration

// UnmarshalJSON accepts a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	str := strings.Trim(string(b), `"`)
	if str == "null" || str == "" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(str)
	if err != nil {
		return fmt.Errorf("%q is not a duration (use e.g. 90s, 5m, 1h)", str)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(time.Duration(d).String())), nil
}

// Load reads a YAML (or JSON) configuration file. Unknown fields are errors, so a
// misspelt key does not silently fall back to a default.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading the configuration: %w", err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return Config{}, fmt.Errorf("parsing %s: %w", path, err)
	}
	return c, nil
}

// ParseModelFlag parses the --model flag:
//
//	NAME=PATH[:key=value,key=value...]
//
// with keys ctx (context length), parallel, threads, residency, idle (idle timeout), memory
// (estimate override), kv (KV cache type), alias (repeatable, or several joined
// with "|"), cache (on or off: the prompt cache), hot (its hot budget cap), ssd
// (its SSD quota) and sha256 (a pulled source's digest). The options suffix is recognised only when everything after the last
// ":" is a list of known keys, so a path containing ":" still works.
func ParseModelFlag(s string) (Model, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || rest == "" {
		return Model{}, fmt.Errorf("--model %q: want NAME=PATH[:ctx=N,parallel=N,threads=N,residency=R,idle=D,memory=SIZE,kv=T,alias=A,cache=on|off,hot=SIZE,ssd=SIZE]", s)
	}
	m := Model{Name: name, Path: rest}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 || !isOptionList(rest[i+1:]) {
		return m, nil
	}
	m.Path = rest[:i]
	for _, kv := range strings.Split(rest[i+1:], ",") {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "ctx", "context":
			m.ContextLength, err = parseInt32(v)
		case "parallel":
			m.Parallel, err = parseInt32(v)
		case "threads":
			m.Threads, err = parseInt32(v)
		case "residency":
			m.Residency = canonicalResidency(v)
		case "idle", "idleTimeout":
			var d time.Duration
			d, err = time.ParseDuration(v)
			m.IdleTimeout = Duration(d)
		case "memory":
			m.Memory, err = ParseSize(v)
		case "kv", "kvCacheType":
			m.KVCacheType = engine.KVCacheType(v)
		case "alias":
			m.Aliases = append(m.Aliases, strings.Split(v, "|")...)
		case "cache":
			var on bool
			switch strings.ToLower(v) {
			case "on", "true", "yes":
				on = true
			case "off", "false", "no":
			default:
				err = fmt.Errorf("%q is not on or off", v)
			}
			m.promptCache().Enabled = &on
		case "hot":
			var sz Size
			sz, err = ParseSize(v)
			m.promptCache().HotBytes = &sz
		case "ssd":
			var sz Size
			sz, err = ParseSize(v)
			m.promptCache().SSDBytes = &sz
		case "sha256":
			m.SHA256 = v
		}
		if err != nil {
			return Model{}, fmt.Errorf("--model %q: option %s: %w", s, k, err)
		}
	}
	return m, nil
}

var optionKeys = []string{"ctx", "context", "parallel", "threads", "residency", "idle", "idleTimeout", "memory", "kv", "kvCacheType", "alias",
	"cache", "hot", "ssd", "sha256"}

func parseInt32(s string) (int32, error) {
	v, err := strconv.ParseInt(s, 10, 32)
	return int32(v), err
}

func (m *Model) promptCache() *PromptCache {
	if m.PromptCache == nil {
		m.PromptCache = &PromptCache{}
	}
	return m.PromptCache
}

func isOptionList(s string) bool {
	if s == "" {
		return false
	}
	for _, kv := range strings.Split(s, ",") {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !slices.Contains(optionKeys, k) {
			return false
		}
	}
	return true
}

// canonicalResidency accepts any capitalisation ("ondemand", "pinned").
func canonicalResidency(s string) string {
	for _, r := range []string{ResidencyOnDemand, ResidencyResident, ResidencyPinned} {
		if strings.EqualFold(s, r) {
			return r
		}
	}
	return s
}

// Merge applies the set fields of over (flags) onto c (the file) and appends over's
// models. Validation reports duplicate names.
func (c Config) Merge(over Config) Config {
	if over.Listen != "" {
		c.Listen = over.Listen
	}
	if over.APIKey != "" {
		c.APIKey, c.APIKeyFile = over.APIKey, ""
	}
	if over.APIKeyFile != "" {
		c.APIKeyFile, c.APIKey = over.APIKeyFile, ""
	}
	if over.Runner != "" {
		c.Runner = over.Runner
	}
	if over.RunnerThreads != 0 {
		c.RunnerThreads = over.RunnerThreads
	}
	if over.RunnerSandbox != "" {
		c.RunnerSandbox = over.RunnerSandbox
	}
	c.AllowUnconfinedRunners = c.AllowUnconfinedRunners || over.AllowUnconfinedRunners
	if over.MemoryCeiling != 0 {
		c.MemoryCeiling = over.MemoryCeiling
	}
	if over.MemoryReserve != 0 {
		c.MemoryReserve = over.MemoryReserve
	}
	if over.IdleTimeout != 0 {
		c.IdleTimeout = over.IdleTimeout
	}
	if over.MaxBodyBytes != 0 {
		c.MaxBodyBytes = over.MaxBodyBytes
	}
	if over.PromptCacheDir != "" {
		c.PromptCacheDir = over.PromptCacheDir
	}
	if over.PromptCacheHotBytes != nil {
		c.PromptCacheHotBytes = over.PromptCacheHotBytes
	}
	if over.PromptCacheSSDBytes != nil {
		c.PromptCacheSSDBytes = over.PromptCacheSSDBytes
	}
	c.Models = append(slices.Clone(c.Models), over.Models...)
	return c
}

// Complete fills in defaults, reads the API key file, and validates. The returned
// error lists every problem found, one per line.
func (c Config) Complete() (Config, error) {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	var errs []error
	if c.PromptCacheDir != "" {
		if abs, err := filepath.Abs(c.PromptCacheDir); err != nil {
			errs = append(errs, fmt.Errorf("promptCacheDir: %w", err))
		} else {
			c.PromptCacheDir = abs
		}
	}
	if c.APIKeyFile != "" {
		b, err := os.ReadFile(c.APIKeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("apiKeyFile: %w", err))
		} else if c.APIKey = strings.TrimSpace(string(b)); c.APIKey == "" {
			errs = append(errs, fmt.Errorf("apiKeyFile: %s is empty", c.APIKeyFile))
		}
	}
	c.Models = slices.Clone(c.Models)
	for i := range c.Models {
		m := &c.Models[i]
		if m.Residency == "" {
			m.Residency = ResidencyOnDemand
		}
		m.Residency = canonicalResidency(m.Residency)
		if m.KVCacheType == "" {
			m.KVCacheType = engine.DefaultKVCacheType
		}
	}
	errs = append(errs, c.validate()...)
	if len(errs) > 0 {
		return c, &InvalidError{Errs: errs}
	}
	return c, nil
}

// InvalidError lists every problem of a configuration.
type InvalidError struct{ Errs []error }

func (e *InvalidError) Error() string {
	msgs := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		msgs[i] = err.Error()
	}
	return "invalid configuration:\n  " + strings.Join(msgs, "\n  ")
}

func (e *InvalidError) Unwrap() []error { return e.Errs }

// modelName: what a model name or alias may look like. No "/" so it fits one path
// segment of /api/models/{id}/load.
var modelName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@+-]*$`)

func (c Config) validate() []error {
	var errs problems
	c.validateServing(&errs)
	if len(c.Models) == 0 {
		errs.add("models: at least one model is required (--model NAME=PATH or models: in --config)")
	}
	names := modelNames{} // name or alias → the model that claims it
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		if m.Name != "" {
			f = fmt.Sprintf("models[%d] (%s)", i, m.Name)
		}
		names.claim(&errs, m.Name, m.Name, f+".name")
		for _, a := range m.Aliases {
			names.claim(&errs, a, m.Name, f+".aliases")
		}
		m.validate(&errs, f)
	}
	return errs
}

// problems collects a configuration's errors in the order its checks find them.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// validateServing checks the settings of the agent's serving as a whole: its listen
// address, the runners' threads and sandbox, the body limit and the memory ceiling.
func (c Config) validateServing(errs *problems) {
	if host, port, err := net.SplitHostPort(c.Listen); err != nil {
		errs.add("listen: %q is not host:port: %v", c.Listen, err)
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		errs.add("listen: %q has an invalid port", c.Listen)
	} else if host != "" && host != "localhost" && net.ParseIP(host) == nil {
		errs.add("listen: %q: the host must be an IP address or localhost", c.Listen)
	}
	if c.RunnerThreads < 0 || c.RunnerThreads > engine.MaxThreads {
		errs.add("runnerThreads: %d is not between 0 (the thread policy chooses) and %d", c.RunnerThreads, engine.MaxThreads)
	}
	if _, err := sandbox.ParseMode(c.RunnerSandbox); err != nil {
		errs.add("runnerSandbox: %v", err)
	}
	if c.MaxBodyBytes < 1024 {
		errs.add("maxBodyBytes: %d is too small (at least 1024)", c.MaxBodyBytes)
	}
	if c.MemoryCeiling != 0 && c.MemoryCeiling < 64<<20 {
		errs.add("memoryCeiling: %s is too small to hold any model (at least 64Mi)", c.MemoryCeiling)
	}
}

// modelNames maps each model name or alias to the model that claims it.
type modelNames map[string]string

// claim checks name n, given in field, and claims it for model owner; a name already
// claimed (by this model or another) is an error.
func (names modelNames) claim(errs *problems, n, owner, field string) {
	switch {
	case n == "":
		errs.add("%s: must not be empty", field)
	case len(n) > MaxModelNameLength:
		errs.add("%s: %q is longer than %d characters", field, n, MaxModelNameLength)
	case !modelName.MatchString(n):
		errs.add("%s: %q may only contain letters, digits and . _ : @ + - (and must start with a letter or digit)", field, n)
	}
	if prev, ok := names[n]; ok && n != "" {
		if prev == owner {
			errs.add("%s: %q is given twice", field, n)
		} else {
			errs.add("%s: %q is already used by model %q", field, n, prev)
		}
		return
	}
	names[n] = owner
}

// validate checks one model's fields other than its names; f names the model in errors.
func (m Model) validate(errs *problems, f string) {
	switch st, err := os.Stat(m.Path); {
	case m.Path == "":
		errs.add("%s.path: a GGUF file is required", f)
	case err != nil:
		errs.add("%s.path: %v", f, err)
	case !st.Mode().IsRegular():
		errs.add("%s.path: %s is not a regular file", f, m.Path)
	}
	if err := m.Settings.Validate(); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			errs.add("%s.%v", f, e)
		}
	}
	if m.SplitPipeline > 1 {
		errs.add("%s.splitPipeline: %d needs a replica split across Macs (a ModelDeployment with placement.maxMacsPerReplica above 1); a model served on one Mac decodes in one context", f, m.SplitPipeline)
	}
	switch m.Residency {
	case ResidencyOnDemand, ResidencyResident, ResidencyPinned:
	default:
		errs.add("%s.residency: %q is not OnDemand, Resident or Pinned", f, m.Residency)
	}
	if m.IdleTimeout < 0 {
		errs.add("%s.idleTimeout: %s is negative", f, time.Duration(m.IdleTimeout))
	}
	if m.IdleTimeout != 0 && m.Residency != ResidencyOnDemand {
		errs.add("%s.idleTimeout: only OnDemand models expire (this one is %s)", f, m.Residency)
	}
	if pc := m.PromptCache; pc != nil && !pc.IsEnabled() && (pc.HotBytes != nil || pc.SSDBytes != nil) {
		errs.add("%s.promptCache: hotBytes and ssdBytes need the prompt cache enabled (remove them or enable it)", f)
	}
}
