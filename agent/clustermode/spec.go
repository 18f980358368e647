package clustermode

import (
	"context"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// BuildSpec is the pool spec of a replica's entry: its engine settings, residency and
// idle timeout, its namespace (whose prompt cache directories it uses), the dimensions
// the prefill guard needs from the GGUF header (as the standalone agent builds it),
// and the scheduler's reservation as the estimate, so
// the pool admits what the control plane placed. The entry has no aliases: served
// names are resolved by the agent (several replicas on one Mac may share them).
func BuildSpec(ctx context.Context, name, path string, mr *v1alpha1.ModelReplica) (enginepool.ModelSpec, error) {
	t := mr.Spec.Template
	m := config.Model{
		Name:      name,
		Path:      path,
		Settings:  t.Engine.Settings,
		Residency: string(t.Residency),
		Memory:    config.Size(mr.Spec.MemoryReservation.Value()),
	}
	if m.Residency == "" {
		m.Residency = string(v1alpha1.ResidencyResident)
	}
	if t.IdleTimeout != nil {
		m.IdleTimeout = config.Duration(t.IdleTimeout.Duration)
	}
	m.PromptCache = promptCache(t.Engine.PromptCache)
	spec, err := standalone.BuildSpec(ctx, m)
	// The replica's namespace is its tenant: its prompt cache is its own.
	spec.Namespace = mr.Namespace
	return spec, err
}

// promptCache is a deployment's prompt cache settings in the agent's terms (nil:
// enabled with the agent's settings).
func promptCache(pc *v1alpha1.PromptCacheSpec) *config.PromptCache {
	if pc == nil {
		return nil
	}
	size := func(q *resource.Quantity) *config.Size {
		if q == nil {
			return nil
		}
		s := config.Size(max(q.Value(), 0))
		return &s
	}
	out := &config.PromptCache{Enabled: pc.Enabled, HotBytes: size(pc.HotBytes), SSDBytes: size(pc.SSDBytes)}
	if !out.IsEnabled() {
		out.HotBytes, out.SSDBytes = nil, nil
	}
	return out
}
