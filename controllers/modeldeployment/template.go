package modeldeployment

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Defaults the API server applies (kubebuilder:default markers); the template applies
// them again so that an object written without them (an older API server, a client
// that bypassed defaulting, a unit test) hashes like one written with them.
// The engine settings' defaults are package engine's.
const defaultResidency = v1alpha1.ResidencyResident

// hashLength is how many hex digits of the SHA-256 go into the template hash.
const hashLength = 10

// replicaTemplate returns the template md's replicas run, with every default written
// out: engine settings, residency, and servedName (the deployment's name). Aliases are
// sorted, since they are a set; promptCache.peerWarmup is left out.
func replicaTemplate(md *v1alpha1.ModelDeployment) v1alpha1.ModelReplicaTemplate {
	t := v1alpha1.ModelReplicaTemplate{
		Model:       *md.Spec.Model.DeepCopy(),
		Engine:      md.Spec.Engine,
		Residency:   md.Spec.Residency,
		IdleTimeout: md.Spec.IdleTimeout.DeepCopy(),
	}
	if t.Model.ServedName == "" {
		t.Model.ServedName = md.Name
	}
	if len(t.Model.Aliases) == 0 {
		t.Model.Aliases = nil
	} else {
		slices.Sort(t.Model.Aliases)
		t.Model.Aliases = slices.Compact(t.Model.Aliases)
	}
	if pc := t.Engine.PromptCache; pc != nil && pc.PeerWarmup != nil {
		// Peer warm-up is the gateway's (it reads the deployment), not the runner's:
		// turning it on or off rolls no replica.
		pc = pc.DeepCopy()
		pc.PeerWarmup = nil
		if *pc == (v1alpha1.PromptCacheSpec{}) {
			pc = nil
		}
		t.Engine.PromptCache = pc
	}
	t.Engine.Settings = t.Engine.WithDefaults()
	if t.Engine.ContextLength == 0 {
		t.Engine.ContextLength = engine.DefaultContextLength
	}
	if t.Residency == "" {
		t.Residency = defaultResidency
	}
	return t
}

// templateHash is a short stable hash of the template's JSON. encoding/json writes
// struct fields in declaration order and a metav1.Duration in its canonical form
// ("1m0s"), so equal templates give equal bytes.
func templateHash(t v1alpha1.ModelReplicaTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// The template is plain data; Marshal cannot fail on it.
		panic(fmt.Sprintf("marshalling a replica template: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:hashLength]
}
