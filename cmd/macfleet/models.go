package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/kubescheme"
	"github.com/macfleet/macfleet/internal/modelfit"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/metal/enginepool"
)

func init() {
	models := &cobra.Command{Use: "models", Short: "Questions about models before you deploy them"}
	models.AddCommand(modelsFitCmd())
	root.AddCommand(models)
}

// fitFlags are the flags of `macfleet models fit`.
type fitFlags struct {
	sources                              pullFlags
	projector, draft                     string
	kubeconfig, kubeContext, namespace   string
	memory, memoryCeiling, memoryReserve string
	local, asJSON                        bool
	contextLength                        int64
	settings                             modelfit.Settings
	kvCacheType                          string
	timeout                              time.Duration
}

func modelsFitCmd() *cobra.Command {
	var ff fitFlags
	cmd := &cobra.Command{
		Use:   "fit SOURCE",
		Short: "Tell which Macs can serve a model at which context, from its GGUF header and the Macs' free memory",
		Long: `Reads the model's GGUF header — a few MiB by HTTP range requests for hf://, ollama:// and
https:// sources, nothing is downloaded whole — estimates the memory a replica needs at a ladder
of contexts (4k, 8k, 16k, … up to 128k or the model's trained context; --context-length asks one)
the way the manager does, and sets each against what each Mac offers.

The Macs are the fleet's MacNodes, read with your kubeconfig: a Mac offers its effective memory
ceiling less its agent's own memory, of which its loaded models have committed some. "yes"
fits in what is free now; "once freed" fits only after the Mac's other models are unloaded.
With --memory SIZE it answers for one Mac of that much unified memory at the agent's default
ceiling; with --local (or when no kubeconfig is found) for this machine, as 'macfleet doctor'
computes its ceiling.

Sources are read through the node agent's source policy and endpoints: --source-policy, else the
cluster's SourcePolicy for --namespace on a fleet, else the built-in default (hf:// and ollama://
only, no loopback or LAN address). A model stored in parts (NAME-00001-of-0000N.gguf) is named by
its first part: the header of every part is read and counted.

With --projector, a vision model's multimodal projector (its mmproj GGUF, a path or a source read
the same way) is counted in every need beside the model, as the manager counts a deployment's
spec.model.projector and 'macfleet serve --projector' the agent. With --draft, a draft model for
speculative decoding (a path or a source, read the same way) is counted likewise: its weights and
its KV cache for the same context and slots, as spec.model.draft and 'macfleet serve --draft'.`,
		Example: `  macfleet models fit hf://Qwen/Qwen2.5-Coder-7B-Instruct-GGUF/qwen2.5-coder-7b-instruct-q4_k_m.gguf
  macfleet models fit ollama://qwen2.5-coder:7b --memory 24Gi
  macfleet models fit ./model.gguf --local --context-length 32768 --parallel 2
  macfleet models fit hf://org/repo/model.gguf --kubeconfig ~/.kube/fleet --json
  macfleet models fit hf://ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf --projector hf://ggml-org/gemma-3-4b-it-GGUF/mmproj-model-f16.gguf --memory 16Gi`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), ff.timeout)
			defer cancel()
			rep, err := ff.run(ctx, args[0])
			if err != nil {
				return err
			}
			if ff.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return rep.Write(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	ff.sources.registerSources(f)
	f.StringVar(&ff.kubeconfig, "kubeconfig", "", "kubeconfig of the fleet; default: $KUBECONFIG, then ~/.kube/config, then in-cluster")
	f.StringVar(&ff.kubeContext, "context", "", "context of the kubeconfig to use")
	f.StringVarP(&ff.namespace, "namespace", "n", "", "namespace whose source-policy rules apply (default: the kubeconfig context's; "+serveNamespace+" for one Mac)")
	f.StringVar(&ff.projector, "projector", "", "count this multimodal projector (mmproj GGUF: a path or a source) beside the model, as a deployment's spec.model.projector")
	f.StringVar(&ff.draft, "draft", "", "count this draft model (a path or a source) beside the model, at the same context and slots, as a deployment's spec.model.draft")
	f.StringVar(&ff.memory, "memory", "", "answer for one Mac of this much unified memory (e.g. 24Gi) instead of the fleet")
	f.BoolVar(&ff.local, "local", false, "answer for this machine instead of the fleet")
	f.StringVar(&ff.memoryCeiling, "memory-ceiling", "", "with --memory or --local: the agent's --memory-ceiling")
	f.StringVar(&ff.memoryReserve, "memory-reserve", "", "with --memory or --local: the agent's --memory-reserve (default 4Gi below 24Gi of RAM, else 6Gi)")
	f.Int64Var(&ff.contextLength, "context-length", 0, "estimate at this context (tokens per sequence) only, instead of the ladder")
	f.Int32Var(&ff.settings.Parallel, "parallel", 1, "sequences decoded together, each with the whole context (the engine's parallel)")
	f.StringVar(&ff.kvCacheType, "kv-cache-type", string(estimate.KVF16), "KV cache element type: f16, q8_0 or q4_0")
	f.BoolVar(&ff.asJSON, "json", false, "print the answer as JSON instead of a table")
	f.DurationVar(&ff.timeout, "timeout", 2*time.Minute, "bound on reading the header and the fleet")
	return cmd
}

// run reads the Macs, then the model's header, and decides.
func (ff *fitFlags) run(ctx context.Context, source string) (modelfit.Report, error) {
	if ff.settings.Parallel < 1 {
		return modelfit.Report{}, fmt.Errorf("--parallel %d: want 1 or more", ff.settings.Parallel)
	}
	if ff.contextLength < 0 {
		return modelfit.Report{}, fmt.Errorf("--context-length %d: want a positive number of tokens", ff.contextLength)
	}
	ff.settings.KVCacheType = estimate.KVCacheType(ff.kvCacheType)
	macs, where, policy, err := ff.macs(ctx)
	if err != nil {
		return modelfit.Report{}, err
	}
	h, err := ff.sources.readHeader(ctx, policy, ff.namespace, source)
	if err != nil {
		return modelfit.Report{}, err
	}
	proj, err := ff.readProjector(ctx, policy)
	if err != nil {
		return modelfit.Report{}, err
	}
	draft, err := ff.readDraft(ctx, policy)
	if err != nil {
		return modelfit.Report{}, err
	}
	contexts := []int64{ff.contextLength}
	if ff.contextLength == 0 {
		// The trained context comes with any estimate; the smallest is quick.
		m, _, err := modelfit.Needs(h, source, []int64{modelfit.MinLadderContext}, ff.settings, modelfit.Beside{})
		if err != nil {
			return modelfit.Report{}, fmt.Errorf("estimating %s: %w", source, err)
		}
		contexts = modelfit.Ladder(m.TrainedContext)
	}
	model, needs, err := modelfit.Needs(h, source, contexts, ff.settings, modelfit.Beside{Projector: proj, Draft: draft})
	if err != nil {
		return modelfit.Report{}, fmt.Errorf("estimating %s: %w", source, err)
	}
	return modelfit.Report{Model: model, Settings: ff.settings, Where: where, Needs: needs,
		Macs: modelfit.Decide(macs, needs)}, nil
}

// readProjector reads the header of --projector as the model's is read, and returns
// the memory it adds beside the model; nil when none is named. A projector is one
// file, as the API requires of spec.model.projector.
func (ff *fitFlags) readProjector(ctx context.Context, policy *sourcepolicy.Policy) (*modelfit.Projector, error) {
	h, err := ff.readBeside(ctx, policy, "--projector", "a projector", ff.projector)
	if h == nil || err != nil {
		return nil, err
	}
	return &modelfit.Projector{Source: ff.projector, Bytes: h.ProjectorBytes()}, nil
}

// readBeside reads the header of a file beside the model given by flag (what it
// is; nil when src is empty): one file, as the API requires of the files beside a
// model, read as the model's is.
func (ff *fitFlags) readBeside(ctx context.Context, policy *sourcepolicy.Policy, flag, what, src string) (*estimate.Header, error) {
	if src == "" {
		return nil, nil
	}
	if modelsource.IsSplitPart(src) {
		return nil, fmt.Errorf("%s %s: %s is one file: it cannot be stored in parts", flag, src, what)
	}
	h, err := ff.sources.readHeader(ctx, policy, ff.namespace, src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return h, nil
}

// readDraft reads the header of --draft as the model's is read; nil when none is
// named. A draft model is one file, as the API requires of spec.model.draft.
func (ff *fitFlags) readDraft(ctx context.Context, policy *sourcepolicy.Policy) (*modelfit.Draft, error) {
	h, err := ff.readBeside(ctx, policy, "--draft", "a draft model", ff.draft)
	if h == nil || err != nil {
		return nil, err
	}
	return &modelfit.Draft{Source: ff.draft, Header: h}, nil
}

// macs are the Macs to answer for, a line saying whose they are, and the source
// policy to read the model by (nil: the --source-policy file's or the default).
func (ff *fitFlags) macs(ctx context.Context) ([]modelfit.Mac, string, *sourcepolicy.Policy, error) {
	if ff.memory != "" || ff.local {
		return ff.oneMac()
	}
	if ff.memoryCeiling != "" || ff.memoryReserve != "" {
		return nil, "", nil, errors.New("--memory-ceiling and --memory-reserve describe one Mac: add --memory SIZE or --local (a fleet's Macs report their own ceilings)")
	}
	cc := kubeconfig(ff.kubeconfig, ff.kubeContext)
	rc, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) && ff.kubeconfig == "" {
		macs, where, p, err := ff.oneMac()
		return macs, where + " (no kubeconfig found; --kubeconfig names a fleet's)", p, err
	}
	if err != nil {
		return nil, "", nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	if ff.namespace == "" {
		if ff.namespace, _, err = cc.Namespace(); err != nil {
			return nil, "", nil, fmt.Errorf("the kubeconfig context's namespace: %w", err)
		}
	}
	scheme, err := kubescheme.New()
	if err != nil {
		return nil, "", nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", nil, fmt.Errorf("building a client: %w", err)
	}
	var list v1alpha1.MacNodeList
	if err := c.List(ctx, &list); err != nil {
		return nil, "", nil, fmt.Errorf("listing the fleet's MacNodes at %s: %w", rc.Host, err)
	}
	if len(list.Items) == 0 {
		return nil, "", nil, fmt.Errorf("the cluster at %s has no MacNodes: join a Mac first (README, \"On a real cluster\"), or ask for one Mac with --memory SIZE or --local", rc.Host)
	}
	macs := make([]modelfit.Mac, 0, len(list.Items))
	for i := range list.Items {
		macs = append(macs, modelfit.FromMacNode(&list.Items[i]))
	}
	where := fmt.Sprintf("the %d MacNodes of the cluster at %s", len(macs), rc.Host)
	if ff.sources.sourcePolicy != "" {
		return macs, where, nil, nil
	}
	p, err := clusterPolicy(ctx, c)
	return macs, where, p, err
}

// clusterPolicy is the fleet's SourcePolicy, the default when it has none.
func clusterPolicy(ctx context.Context, c client.Client) (*sourcepolicy.Policy, error) {
	var sp v1alpha1.SourcePolicy
	err := c.Get(ctx, client.ObjectKey{Name: v1alpha1.SourcePolicyName}, &sp)
	switch {
	case apierrors.IsNotFound(err):
		return sourcepolicy.Default(), nil
	case err != nil:
		return nil, fmt.Errorf("reading the fleet's SourcePolicy %q (the rules its Macs pull by): %w; or name a policy file with --source-policy", v1alpha1.SourcePolicyName, err)
	}
	p, err := sourcepolicy.Compile(&sp)
	if err != nil {
		return nil, fmt.Errorf("the fleet's SourcePolicy %q: %w", v1alpha1.SourcePolicyName, err)
	}
	return p, nil
}

// oneMac is the Mac of --memory, else this machine, with the ceiling the agent would
// compute at its defaults (and --memory-ceiling, --memory-reserve).
func (ff *fitFlags) oneMac() ([]modelfit.Mac, string, *sourcepolicy.Policy, error) {
	var ceiling, reserve int64
	for _, s := range []struct {
		name, in string
		dst      *int64
	}{{"memory-ceiling", ff.memoryCeiling, &ceiling}, {"memory-reserve", ff.memoryReserve, &reserve}} {
		if s.in == "" {
			continue
		}
		v, err := config.ParseSize(s.in)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--%s: %w", s.name, err)
		}
		*s.dst = int64(v)
	}
	if ff.namespace == "" {
		ff.namespace = serveNamespace
	}
	var (
		hw    enginepool.Hardware
		name  string
		where string
	)
	if ff.memory != "" {
		if ff.local {
			return nil, "", nil, errors.New("--memory and --local each name the Mac to answer for: give one")
		}
		v, err := config.ParseSize(ff.memory)
		if err != nil || v == 0 {
			return nil, "", nil, fmt.Errorf("--memory %q: want the Mac's unified memory, e.g. 24Gi", ff.memory)
		}
		hw = enginepool.Hardware{TotalBytes: int64(v), MetalWorkingSetBytes: enginepool.MetalWorkingSetEstimate(int64(v))}
		name = "mac-" + strings.ToLower(ff.memory)
		where = "one Mac of " + ff.memory + " at the agent's default ceiling"
	} else {
		g, err := enginepool.NewGauge()
		if err == nil {
			hw, err = g.Hardware()
		}
		if err != nil {
			return nil, "", nil, fmt.Errorf("measuring this machine's memory: %w; or give --memory SIZE", err)
		}
		name, _ = os.Hostname()
		where = "this machine, its ceiling as 'macfleet doctor' computes it"
	}
	c := enginepool.ComputeCeiling(hw, ceiling, reserve, 0, 0)
	return []modelfit.Mac{{Name: name, Ceiling: c.Bytes}}, where, nil, nil
}

// readHeader reads the GGUF header of source: a local file (a path, or file://) in
// place, else by range requests through the node agent's locator under the source
// policy (p, else the --source-policy file's or the default) for namespace.
func (pf pullFlags) readHeader(ctx context.Context, p *sourcepolicy.Policy, namespace, source string) (*estimate.Header, error) {
	if !isSource(source) {
		path := source
		if strings.HasPrefix(source, "file://") {
			src, err := modelsource.Parse(source)
			if err != nil {
				return nil, err
			}
			path = src.LocalPath
		}
		if modelsource.IsSplitPart(path) {
			// A model stored in parts is named by its first part; the header of each is
			// read beside it.
			abs, err := filepath.Abs(path)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", source, err)
			}
			if _, err := modelsource.Parse((&url.URL{Scheme: "file", Path: abs}).String()); err != nil {
				return nil, err
			}
		}
		h, err := estimate.ReadHeader(ctx, estimate.Params{Path: path})
		if err != nil {
			return nil, fmt.Errorf("reading the GGUF header of %s: %w", source, err)
		}
		return h, nil
	}
	if p == nil {
		var err error
		if p, err = pf.policy(); err != nil {
			return nil, err
		}
	}
	loc := store.NewLocator(store.Options{HFEndpoint: pf.hfEndpoint, HFToken: pf.token(), OllamaRegistry: pf.ollamaRegistry,
		Policy: sourcepolicy.NewHolder(p)})
	remote, err := loc.Locate(ctx, namespace, source)
	if err == nil {
		var h *estimate.Header
		h, err = estimate.ReadHeader(ctx, estimate.Params{URL: remote.Location.URL, Header: remote.Header, HTTPClient: remote.Client})
		if err == nil {
			return h, nil
		}
	}
	return nil, tokenHint(source, fmt.Errorf("reading the GGUF header of %s: %w", source, err))
}

// tokenHint adds to a refusal of an hf:// source by the hub what to do about it.
func tokenHint(source string, err error) error {
	var status *modelsource.StatusError
	if errors.As(err, &status) && (status.StatusCode == http.StatusUnauthorized || status.StatusCode == http.StatusForbidden) &&
		strings.HasPrefix(source, "hf://") {
		return fmt.Errorf("%w: a gated or private model needs a token with access to it: --hf-token or $%s", err, hfTokenEnv)
	}
	return err
}
