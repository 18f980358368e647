package v1alpha1_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, &env, testenv.WithScheme(mfv1.AddToScheme))
}

const goodSHA = "3b1d7c0e9a5f4e2d8c6b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d"

func validDeployment() mfv1.ModelDeploymentSpec {
	return mfv1.ModelDeploymentSpec{
		Model: mfv1.ModelSource{Source: "hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf"},
	}
}

// TestModelDeploymentValidation applies each manifest to the real API server and checks
// that it is accepted, or rejected with the human message of the rule it breaks.
func TestModelDeploymentValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	cases := []struct {
		name    string
		mutate  func(*mfv1.ModelDeploymentSpec)
		wantErr string // empty: accepted
	}{
		{name: "minimal hf source", mutate: func(*mfv1.ModelDeploymentSpec) {}},
		{name: "ollama source", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Source = "ollama://qwen2.5:0.5b" }},
		{name: "https source with sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source, s.Model.SHA256 = "https://models.example/x.gguf", goodSHA
		}},
		{name: "unknown scheme", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Source = "s3://bucket/model.gguf" },
			wantErr: "source must start with hf://, ollama://, http://, https:// or file://"},
		{name: "the first part of a model stored in parts", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "hf://org/big-GGUF/Q4_K_M/big-Q4_K_M-00001-of-00003.gguf@main"
		}},
		{name: "a signed URL of a first part", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "https://models.example/big-00001-of-00002.gguf?sig=abc"
		}},
		{name: "a later part", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "hf://org/big-GGUF/Q4_K_M/big-Q4_K_M-00002-of-00003.gguf@main"
		}, wantErr: "source names a later part of a model stored in parts: name its first part (NAME-00001-of-0000N.gguf), from which every part is fetched"},
		{name: "a signed URL of a later part", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "https://models.example/big-00002-of-00002.GGUF?sig=abc"
		}, wantErr: "name its first part (NAME-00001-of-0000N.gguf)"},
		{name: "a tenth part", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "file:///m/big-00010-of-00012.gguf"
			s.Resources = &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("1Gi"))}
		}, wantErr: "source names a later part of a model stored in parts"},
		{name: "a merged file named after its parts", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "hf://org/big-GGUF/big-00001-of-00003-merged.gguf"
		}},
		{name: "scheme without a file", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Source = "https://" },
			wantErr: "spec.model.source"},
		{name: "relative file path", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "file://models/x.gguf"
			s.Resources = &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("1Gi"))}
		}, wantErr: "a file:// source must be an absolute path"},
		{name: "short sha256", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.SHA256 = "abc123" },
			wantErr: "sha256 must be 64 lowercase hexadecimal characters"},
		{name: "uppercase sha256", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.SHA256 = strings.ToUpper(goodSHA) },
			wantErr: "sha256 must be 64 lowercase hexadecimal characters"},
		{name: "negative replicas", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Replicas = ptr.To[int32](-1) },
			wantErr: "replicas must not be negative"},
		{name: "zero replicas", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Replicas = ptr.To[int32](0) }},
		{name: "access granted to namespaces and to all", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Access = &mfv1.Access{Namespaces: []string{"team-a", "ml-7", "*"}}
		}},
		{name: "access to a name that is not a namespace", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Access = &mfv1.Access{Namespaces: []string{"team-a", "Team_B"}}
		}, wantErr: `each entry must be a namespace name (a DNS-1123 label) or "*" for every namespace`},
		{name: "access to a namespace pattern", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Access = &mfv1.Access{Namespaces: []string{"team-*"}}
		}, wantErr: `each entry must be a namespace name (a DNS-1123 label) or "*" for every namespace`},
		{name: "access to a namespace twice", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Access = &mfv1.Access{Namespaces: []string{"team-a", "team-a"}}
		}, wantErr: `spec.access.namespaces[1]: Duplicate value: "team-a"`},
		{name: "idleTimeout with default residency", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.IdleTimeout = &metav1.Duration{Duration: time.Minute}
		}, wantErr: "idleTimeout is only allowed with residency OnDemand"},
		{name: "idleTimeout with Pinned", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Residency, s.IdleTimeout = mfv1.ResidencyPinned, &metav1.Duration{Duration: time.Minute}
		}, wantErr: "idleTimeout is only allowed with residency OnDemand"},
		{name: "idleTimeout with OnDemand", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Residency, s.IdleTimeout = mfv1.ResidencyOnDemand, &metav1.Duration{Duration: time.Minute}
		}},
		{name: "unknown residency", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Residency = "Sometimes" },
			wantErr: `spec.residency: Unsupported value: "Sometimes"`},
		{name: "context too short", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.ContextLength = 128 },
			wantErr: "contextLength must be between 256 and 1048576 tokens"},
		{name: "context too long", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.ContextLength = 2 << 20 },
			wantErr: "contextLength must be between 256 and 1048576 tokens"},
		{name: "too many parallel sequences", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.Parallel = 65 },
			wantErr: "parallel must be between 1 and 64"},
		{name: "unknown kv cache type", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.KVCacheType = "f32" },
			wantErr: `spec.engine.kvCacheType: Unsupported value: "f32"`},
		{name: "threads set", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.Threads = 8 }},
		{name: "too many threads", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.Threads = engine.MaxThreads + 1 },
			wantErr: "threads must be between 0 (the agent chooses) and 256"},
		{name: "negative threads", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Engine.Threads = -1 },
			wantErr: "threads must be between 0 (the agent chooses) and 256"},
		{name: "file source without memory", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Source = "file:///opt/models/x.gguf" },
			wantErr: "a file:// source needs resources.memory"},
		{name: "file source with memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Source = "file:///opt/models/x.gguf"
			s.Resources = &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("7Gi"))}
		}},
		{name: "zero memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Resources = &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("0"))}
		}, wantErr: "resources.memory must be positive"},
		{name: "bad served name", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.ServedName = "-qwen" },
			wantErr: "servedName may contain letters, digits"},
		{name: "unknown strategy", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Placement.Strategy = "Random" },
			wantErr: `spec.placement.strategy: Unsupported value: "Random"`},
		{name: "zero-valued maxReplicasPerNode defaults", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Placement.MaxReplicasPerNode = 0 }},
		{name: "too many replicas per node", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Placement.MaxReplicasPerNode = 100 },
			wantErr: "maxReplicasPerNode must be between 1 and 64"},
		{name: "progress deadline of 10s", mutate: func(s *mfv1.ModelDeploymentSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](10) }},
		{name: "progress deadline too short", mutate: func(s *mfv1.ModelDeploymentSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](5) },
			wantErr: "progressDeadlineSeconds must be between 10 and 86400 (24h)"},
		{name: "progress deadline over a day", mutate: func(s *mfv1.ModelDeploymentSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](86401) },
			wantErr: "progressDeadlineSeconds must be between 10 and 86400 (24h)"},
		{name: "prompt cache sizes", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{HotBytes: ptr.To(resource.MustParse("2Gi")), SSDBytes: ptr.To(resource.MustParse("20Gi"))}
		}},
		{name: "prompt cache tiers off", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(true), HotBytes: ptr.To(resource.MustParse("0")), SSDBytes: ptr.To(resource.MustParse("0"))}
		}},
		{name: "prompt cache disabled", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false)}
		}},
		{name: "negative hot bytes", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{HotBytes: ptr.To(resource.MustParse("-1Gi"))}
		}, wantErr: "hotBytes must not be negative"},
		{name: "negative ssd bytes", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{SSDBytes: ptr.To(resource.MustParse("-5"))}
		}, wantErr: "ssdBytes must not be negative"},
		{name: "sizes with the prompt cache disabled", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false), SSDBytes: ptr.To(resource.MustParse("1Gi"))}
		}, wantErr: "hotBytes and ssdBytes need the prompt cache enabled: remove them or set enabled to true"},
		{name: "peer warm-up", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{PeerWarmup: ptr.To(true)}
		}},
		{name: "peer warm-up off with the prompt cache disabled", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false), PeerWarmup: ptr.To(false)}
		}},
		{name: "peer warm-up with the prompt cache disabled", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false), PeerWarmup: ptr.To(true)}
		}, wantErr: "peerWarmup needs the prompt cache enabled: remove it or set enabled to true"},
		{name: "projector: hf projector", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "hf://ggml-org/gemma-3-4b-it-GGUF/mmproj-model-f16.gguf"
		}},
		{name: "projector: https projector with its sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Model.ProjectorSHA256 = "https://models.example/mmproj.gguf", goodSHA
		}},
		{name: "projector: file projector with memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Resources = "file:///models/mmproj.gguf", projectorMemory()
		}},
		{name: "projector: unknown scheme", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Projector = "s3://bucket/mmproj.gguf" },
			wantErr: "projector must start with hf://, ollama://, http://, https:// or file:// and name a file"},
		{name: "projector: relative file", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Resources = "file://models/mmproj.gguf", projectorMemory()
		}, wantErr: "a file:// projector must be an absolute path"},
		{name: "projector: file projector without memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "file:///models/mmproj.gguf"
		}, wantErr: "a file:// projector needs resources.memory"},
		{name: "projector: in parts", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "hf://org/m-GGUF/mmproj-00001-of-00002.gguf"
		}, wantErr: "a projector is one file: it cannot be stored in parts"},
		{name: "projector: bad sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Model.ProjectorSHA256 = "https://models.example/mmproj.gguf", "ABC"
		}, wantErr: "projectorSHA256 must be 64 lowercase hexadecimal characters"},
		{name: "projector: sha256 without a projector", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.ProjectorSHA256 = goodSHA },
			wantErr: "projectorSHA256 needs projector"},
		{name: "projector: split replicas", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "https://models.example/mmproj.gguf"
			s.Placement = mfv1.Placement{MaxMacsPerReplica: 2}
			s.Residency = mfv1.ResidencyResident
		}, wantErr: "a projector needs every replica on one Mac (placement.maxMacsPerReplica 1)"},
		{name: "draft: hf draft with its sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft, s.Model.DraftSHA256 = "hf://org/small-GGUF/small-q8_0.gguf", goodSHA
		}},
		{name: "draft: file draft with memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft, s.Resources = "file:///models/draft.gguf", projectorMemory()
		}},
		{name: "draft: unknown scheme", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Draft = "s3://bucket/draft.gguf" },
			wantErr: "draft must start with hf://, ollama://, http://, https:// or file:// and name a file"},
		{name: "draft: relative file", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft, s.Resources = "file://models/draft.gguf", projectorMemory()
		}, wantErr: "a file:// draft must be an absolute path"},
		{name: "draft: file draft without memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft = "file:///models/draft.gguf"
		}, wantErr: "a file:// draft needs resources.memory"},
		{name: "draft: in parts", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft = "hf://org/m-GGUF/draft-00001-of-00002.gguf"
		}, wantErr: "a draft model is one file: it cannot be stored in parts"},
		{name: "draft: bad sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft, s.Model.DraftSHA256 = "https://models.example/draft.gguf", "ABC"
		}, wantErr: "draftSHA256 must be 64 lowercase hexadecimal characters"},
		{name: "draft: sha256 without a draft", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.DraftSHA256 = goodSHA },
			wantErr: "draftSHA256 needs draft"},
		{name: "draft: split replicas", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Draft = "https://models.example/draft.gguf"
			s.Placement = mfv1.Placement{MaxMacsPerReplica: 2}
			s.Residency = mfv1.ResidencyResident
		}, wantErr: "a draft model needs every replica on one Mac (placement.maxMacsPerReplica 1)"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := validDeployment()
			tc.mutate(&spec)
			md := &mfv1.ModelDeployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "md-" + strconv.Itoa(i)},
				Spec:       spec,
			}
			err := env.Client.Create(t.Context(), md)
			checkErr(t, err, tc.wantErr)
		})
	}
}

func TestModelDeploymentNameLength(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	for _, tc := range []struct {
		name    string
		wantErr string
	}{
		{name: strings.Repeat("a", 63)},
		{name: strings.Repeat("a", 64), wantErr: "a ModelDeployment's name must be at most 63 characters"},
	} {
		md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}, Spec: validDeployment()}
		checkErr(t, env.Client.Create(t.Context(), md), tc.wantErr)
	}
}

// TestModelDeploymentDefaults checks the defaults the API server fills in.
func TestModelDeploymentDefaults(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "defaults"}, Spec: validDeployment()}
	if err := env.Client.Create(t.Context(), md); err != nil {
		t.Fatalf("creating: %v", err)
	}
	want := mfv1.ModelDeploymentSpec{
		Model:     md.Spec.Model,
		Engine:    mfv1.EngineSpec{Settings: engine.Settings{ContextLength: 4096, Parallel: 1, KVCacheType: mfv1.KVCacheF16}},
		Replicas:  ptr.To[int32](1),
		Residency: mfv1.ResidencyResident,
		Placement: mfv1.Placement{Strategy: mfv1.BinPack, MaxReplicasPerNode: 1},

		ProgressDeadlineSeconds: ptr.To[int32](600),
	}
	if diff := cmp.Diff(want, md.Spec); diff != "" {
		t.Errorf("defaulted spec (-want +got):\n%s", diff)
	}

	// A promptCache given without enabled is enabled.
	pc := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-defaults"}, Spec: validDeployment()}
	pc.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{HotBytes: ptr.To(resource.MustParse("1Gi"))}
	if err := env.Client.Create(t.Context(), pc); err != nil {
		t.Fatalf("creating: %v", err)
	}
	wantPC := &mfv1.PromptCacheSpec{Enabled: ptr.To(true), HotBytes: ptr.To(resource.MustParse("1Gi"))}
	if diff := cmp.Diff(wantPC, pc.Spec.Engine.PromptCache); diff != "" {
		t.Errorf("defaulted promptCache (-want +got):\n%s", diff)
	}
}

func TestModelReplicaImmutability(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	ctx := t.Context()
	mr := &mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r1"},
		Spec: mfv1.ModelReplicaSpec{
			Template:          mfv1.ModelReplicaTemplate{Model: validDeployment().Model},
			TemplateHash:      "abc",
			MemoryReservation: resource.MustParse("1Gi"),
		},
	}
	if err := env.Client.Create(ctx, mr); err != nil {
		t.Fatalf("creating: %v", err)
	}
	// Binding an unbound replica is allowed, once.
	mr.Spec.NodeName = "mac-a"
	if err := env.Client.Update(ctx, mr); err != nil {
		t.Fatalf("binding: %v", err)
	}
	drainAt := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	applyReplicaSteps(t, client.ObjectKeyFromObject(mr), []replicaStep{
		{name: "rebind", mutate: func(r *mfv1.ModelReplica) { r.Spec.NodeName = "mac-b" }, wantErr: "nodeName is immutable once set"},
		{name: "unbind", mutate: func(r *mfv1.ModelReplica) { r.Spec.NodeName = "" }, wantErr: "nodeName is immutable once set"},
		{name: "change template", mutate: func(r *mfv1.ModelReplica) { r.Spec.Template.Engine.ContextLength = 8192 },
			wantErr: "template is immutable"},
		{name: "change reservation", mutate: func(r *mfv1.ModelReplica) { r.Spec.MemoryReservation = resource.MustParse("2Gi") }},
		{name: "drain", mutate: func(r *mfv1.ModelReplica) { r.Spec.Drain = &metav1.Time{Time: drainAt} }},
		{name: "move the drain", mutate: func(r *mfv1.ModelReplica) { r.Spec.Drain = &metav1.Time{Time: drainAt.Add(time.Minute)} },
			wantErr: "drain cannot be changed or cleared once set"},
		{name: "clear the drain", mutate: func(r *mfv1.ModelReplica) { r.Spec.Drain = nil },
			wantErr: "drain cannot be changed or cleared once set"},
	})
}

// TestModelReplicaSelectableNodeName proves agents can list only their own replicas
// with a field selector served by the API server itself.
func TestModelReplicaSelectableNodeName(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	ctx := t.Context()
	for name, node := range map[string]string{"a1": "mac-a", "a2": "mac-a", "b1": "mac-b", "u1": ""} {
		mr := &mfv1.ModelReplica{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: mfv1.ModelReplicaSpec{
				Template:          mfv1.ModelReplicaTemplate{Model: validDeployment().Model},
				TemplateHash:      "abc",
				MemoryReservation: resource.MustParse("1Gi"),
				NodeName:          node,
			},
		}
		if err := env.Client.Create(ctx, mr); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
	var list mfv1.ModelReplicaList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{mfv1.ReplicaNodeNameField: "mac-a"}); err != nil {
		t.Fatalf("listing by %s: %v", mfv1.ReplicaNodeNameField, err)
	}
	var got []string
	for _, r := range list.Items {
		got = append(got, r.Name)
	}
	if diff := cmp.Diff([]string{"a1", "a2"}, got); diff != "" {
		t.Errorf("replicas on mac-a (-want +got):\n%s", diff)
	}
}

func TestMacNodeValidation(t *testing.T) {
	cases := []struct {
		name    string
		ceiling string
		wantErr string
	}{
		{name: "positive ceiling", ceiling: "48Gi"},
		{name: "negative ceiling", ceiling: "-1Gi", wantErr: "memoryCeiling must be positive"},
		{name: "zero ceiling", ceiling: "0", wantErr: "memoryCeiling must be positive"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mn := &mfv1.MacNode{
				ObjectMeta: metav1.ObjectMeta{Name: "validation-mac-" + string(rune('a'+i))},
				Spec:       mfv1.MacNodeSpec{MemoryCeiling: ptr.To(resource.MustParse(tc.ceiling))},
			}
			err := env.Client.Create(t.Context(), mn)
			if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(t.Context(), mn) })
			}
			checkErr(t, err, tc.wantErr)
		})
	}
}

// TestSamplesApplyAndPrint applies config/samples and docs/examples with kubectl and checks that
// `kubectl get md,mr,mn` prints the printer columns.
func TestSamplesApplyAndPrint(t *testing.T) {
	root, kubectl := kubectlFor(t)
	ns := testenv.NewNamespace(t, env.Client)
	kubectl("apply", "-n", ns, "-f", filepath.Join(root, "config", "samples"), "-f", filepath.Join(root, "docs", "examples"))

	mn := &mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "print-mac"}}
	if err := env.Client.Create(t.Context(), mn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(t.Context(), mn) })
	mr := &mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "print-replica"},
		Spec: mfv1.ModelReplicaSpec{
			Template:          mfv1.ModelReplicaTemplate{Model: validDeployment().Model},
			TemplateHash:      "abc",
			MemoryReservation: resource.MustParse("1Gi"),
		},
	}
	if err := env.Client.Create(t.Context(), mr); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		kind    string
		columns []string
		names   []string
	}{
		{kind: "md", columns: []string{"NAME", "READY", "MODEL", "MEMORY", "NODES", "FAILURE", "AGE"}, names: []string{"qwen-7b", "nomic-embed", "llama-8b-local", "tiny-chat", "tiny-chat-ondemand", "tiny-chat-autoscaled", "qwen-7b-elastic", "coder"}},
		{kind: "mr", columns: []string{"NAME", "NODE", "READY", "PHASE", "RESERVED", "RESIDENT", "AGE"}, names: []string{"print-replica"}},
		{kind: "mn", columns: []string{"NAME", "READY", "CHIP", "CEILING", "REPORTED", "USED", "COMMITTED", "PRESSURE", "AGE"}, names: []string{"print-mac"}},
		{kind: "sp", columns: []string{"NAME", "AGE"}, names: []string{"default"}},
		{kind: "hpa", columns: []string{"NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"}, names: []string{"ModelDeployment/qwen-7b"}},
	} {
		out := kubectl("get", "-n", ns, tc.kind)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if diff := cmp.Diff(tc.columns, strings.Fields(lines[0])); diff != "" {
			t.Errorf("kubectl get %s columns (-want +got):\n%s\n%s", tc.kind, diff, out)
		}
		for _, n := range tc.names {
			if !strings.Contains(out, n) {
				t.Errorf("kubectl get %s does not list %s:\n%s", tc.kind, n, out)
			}
		}
	}
	// The macfleet category lists all three kinds.
	if out := kubectl("get", "-n", ns, "macfleet"); !strings.Contains(out, "modeldeployment.macfleet.dev/qwen-7b") ||
		!strings.Contains(out, "modelreplica.macfleet.dev/print-replica") {
		t.Errorf("kubectl get macfleet misses objects:\n%s", out)
	}
}

// kubectlFor returns the repository's root and a kubectl bound to the test API
// server, failing the test when a command fails.
func kubectlFor(t *testing.T) (root string, kubectl func(args ...string) string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return root, func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}

// projectorMemory is the memory of a deployment whose projector is a file:// one.
func projectorMemory() *mfv1.ModelResources {
	return &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("2Gi"))}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("rejected, want accepted: %v", err)
	case want != "" && err == nil:
		t.Fatalf("accepted, want rejected with %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("rejected with\n  %v\nwant a message containing\n  %q", err, want)
	}
}
