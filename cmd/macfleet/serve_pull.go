package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// serveNamespace is the namespace `macfleet serve` fetches models for: the one a
// --source-policy file's rules must name (or "*").
const serveNamespace = "serve"

// hfTokenEnv holds the hub token when --hf-token is not given.
const hfTokenEnv = "HF_TOKEN"

// pullFlags are the flags of `macfleet serve` for models given as sources: the same
// model store and source policy as the node agent's.
type pullFlags struct {
	storeDir, hfToken, hfEndpoint, ollamaRegistry, sourcePolicy string
}

func (pf *pullFlags) register(f *pflag.FlagSet) {
	f.StringVar(&pf.storeDir, "store-dir", config.DataDir("models"), "model store of the models given as sources (hf://, ollama://, https://); "+
		"the node agent's default, so both share the files")
	pf.registerSources(f)
}

// registerSources registers the flags that say where sources are read from and
// which may be: all of register's but the store's directory.
func (pf *pullFlags) registerSources(f *pflag.FlagSet) {
	f.StringVar(&pf.hfToken, "hf-token", "", "token sent with hf:// downloads, for gated and private models (default $"+hfTokenEnv+")")
	f.StringVar(&pf.hfEndpoint, "hf-endpoint", modelsource.DefaultHFEndpoint, "model hub that hf:// sources download from")
	f.StringVar(&pf.ollamaRegistry, "ollama-registry", modelsource.DefaultOllamaRegistry, "registry that ollama:// sources download from")
	f.StringVar(&pf.sourcePolicy, "source-policy", "", "a SourcePolicy manifest (YAML) deciding which sources may be pulled and which addresses "+
		"downloads may reach, its rules for namespace "+serveNamespace+" or *; default: hf:// and ollama:// only, no loopback or LAN address")
}

// isSource reports whether a model's path is a source to pull rather than a file here.
func isSource(path string) bool {
	return strings.Contains(path, "://") && !strings.HasPrefix(path, "file://")
}

// policy is the --source-policy file's policy, else the built-in default.
func (pf pullFlags) policy() (*sourcepolicy.Policy, error) {
	if pf.sourcePolicy == "" {
		return sourcepolicy.Default(), nil
	}
	b, err := os.ReadFile(pf.sourcePolicy)
	if err != nil {
		return nil, fmt.Errorf("--source-policy: %w", err)
	}
	var sp v1alpha1.SourcePolicy
	if err := yaml.UnmarshalStrict(b, &sp); err != nil {
		return nil, fmt.Errorf("--source-policy %s: %w", pf.sourcePolicy, err)
	}
	if sp.Kind != "SourcePolicy" {
		return nil, fmt.Errorf("--source-policy %s: kind %q, want SourcePolicy", pf.sourcePolicy, sp.Kind)
	}
	p, err := sourcepolicy.Compile(&sp)
	if err != nil {
		return nil, fmt.Errorf("--source-policy %s: %w", pf.sourcePolicy, err)
	}
	return p, nil
}

// token is --hf-token, else $HF_TOKEN.
func (pf pullFlags) token() string {
	if pf.hfToken != "" {
		return pf.hfToken
	}
	return os.Getenv(hfTokenEnv)
}

// pull fetches every model whose path is a source through the node agent's model
// store, checked by the source policy on every connection and redirect and verified
// (sha256= when given, the manifest's digest for ollama://, the GGUF magic), and points
// it at the stored file. Models given as files are left as they are.
func (pf pullFlags) pull(ctx context.Context, models []config.Model, log logr.Logger) error {
	var st *store.Store
	for i := range models {
		m := &models[i]
		if !isSource(m.Path) {
			if m.SHA256 != "" {
				return fmt.Errorf("model %s: sha256= checks a pulled source (hf://, ollama://, https://); %s is a file here", m.Name, m.Path)
			}
			continue
		}
		if st == nil {
			var err error
			if st, err = pf.store(log); err != nil {
				return err
			}
		}
		log.Info("Pulling model", "model", m.Name, "source", m.Path)
		path, err := st.Fetch(ctx, serveNamespace, m.Path, m.SHA256, progressLogger(log, m.Name))
		if err != nil {
			return fmt.Errorf("model %s: %w", m.Name, tokenHint(m.Path, err))
		}
		log.Info("Pulled model", "model", m.Name, "source", m.Path, "path", path)
		m.Path, m.SHA256 = path, ""
	}
	return pf.pullProjectors(ctx, models, log)
}

// pullProjectors fetches every model's projector and draft model given as a source,
// as pull does its model, and points them at the stored files.
func (pf pullFlags) pullProjectors(ctx context.Context, models []config.Model, log logr.Logger) error {
	var st *store.Store
	for i := range models {
		m := &models[i]
		for _, f := range modelFiles {
			src := f.field(m)
			if !isSource(*src) {
				continue
			}
			if st == nil {
				var err error
				if st, err = pf.store(log); err != nil {
					return err
				}
			}
			log.Info("Pulling the "+f.noun, "model", m.Name, "source", *src)
			path, err := st.Fetch(ctx, serveNamespace, *src, "", progressLogger(log, m.Name+" "+f.noun))
			if err != nil {
				return fmt.Errorf("model %s: its %s: %w", m.Name, f.noun, tokenHint(*src, err))
			}
			*src = path
		}
	}
	return nil
}

// store is the model store pulled sources go to, under the source policy.
func (pf pullFlags) store(log logr.Logger) (*store.Store, error) {
	p, err := pf.policy()
	if err != nil {
		return nil, err
	}
	return store.New(pf.storeDir, store.Options{HFEndpoint: pf.hfEndpoint, HFToken: pf.token(), OllamaRegistry: pf.ollamaRegistry,
		Policy: sourcepolicy.NewHolder(p), Log: log.WithName("store")})
}

// progressLogger logs a download's progress at every tenth of it.
func progressLogger(log logr.Logger, model string) func(done, total int64) {
	last := int64(-1)
	return func(done, total int64) {
		if total <= 0 {
			return
		}
		if tenth := done * 10 / total; tenth != last {
			last = tenth
			log.Info("Pulling model", "model", model, "percent", tenth*10, "bytes", done, "total", total)
		}
	}
}
