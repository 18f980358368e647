package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/hubtoken"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufheader"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// A model stored in parts (NAME-00001-of-0000N.gguf, as the hubs store large models)
// through hf://, on the local fleet's hub double: downloaded part by part on each Mac
// that runs it (each part checked), estimated from every part's header, served, and
// split across two Macs.

const (
	partsRepo  = "org/split-GGUF"
	partsCount = 3
	// partsSource names the first part, as a user copies it from the hub.
	partsSource = "hf://" + partsRepo + "/split-00001-of-00003.gguf"
)

// hubParts writes splitModelFile's model in count parts into the hub double's
// repository repo (as split-0000i-of-0000N.gguf) and returns their paths, the first
// first.
func hubParts(t *testing.T, repo string, count int) []string {
	t.Helper()
	spec, err := splitSpec()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(fleet.HubDir, repo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	parts, err := ggufsynth.WriteParts(filepath.Join(dir, "split"), spec, count)
	if err != nil {
		t.Fatal(err)
	}
	return parts
}

// TestModelInPartsFromTheHub: a three-part model named by its first part's hf://
// source is estimated as the same model in one file is (every part's tensors
// counted), is downloaded by each Mac that runs it, every part verified against the
// hub's file, serves in one process, and split across two Macs answers the same
// greedy tokens.
func TestModelInPartsFromTheHub(t *testing.T) {
	parts := hubParts(t, partsRepo, partsCount)
	if err := splitModel(); err != nil {
		t.Fatal(err)
	}
	nsRef, nsWhole, ns := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	// The same model in one file, never run: its estimate is what the parts' must be.
	ref := splitDeployment(nsRef, "ref", 1, "")
	ref.Spec.Replicas = ptr.To[int32](0)
	whole, split := splitDeployment(nsWhole, "whole", 1, ""), splitDeployment(ns, "split", 2, "parts")
	whole.Spec.Model.Source, split.Spec.Model.Source = partsSource, partsSource
	create(t, ref)
	create(t, whole)
	create(t, split)

	// The split replica waits for its pool: no replica of its namespace measured a
	// footprint, so its reservation is the estimate.
	lm := layerMemoryOf(t, ns, "split")
	refEstimate, partsEstimate := estimatedMemory(t, nsRef, "ref"), estimatedMemory(t, ns, "split")
	if partsEstimate != refEstimate {
		t.Errorf("the model in %d parts is estimated at %d bytes, the same model in one file at %d", partsCount, partsEstimate, refEstimate)
	}
	names := addSplitPool(t, "parts", poolCeilings(t, lm, gangLayers(int64(lm.Layers), 2)...)...)
	t.Cleanup(func() { removeDeployment(t, ns, "split") })
	gang := checkGang(t, ns, "split", names)
	wholeReplicas := waitReady(t, nsWhole, "whole", 1, 3*time.Minute)

	c := gatewayClient()
	for _, p := range splitPrompts[:2] {
		wantTokens, gotTokens := greedyTokens(t, c, nsWhole+"/whole", p), greedyTokens(t, c, ns+"/split", p)
		if len(wantTokens) == 0 || !slices.Equal(gotTokens, wantTokens) {
			t.Errorf("prompt %q: split across %v the model in parts generated %v, in one process %v", p, gang.Spec.Split.Macs, gotTokens, wantTokens)
		}
	}

	// The head's Mac and the one-process replica's hold every part, each verified;
	// the worker's Mac the first part and those holding its layers.
	for _, mac := range []string{wholeReplicas[0].Spec.NodeName, gang.Spec.NodeName} {
		if got := storedParts(t, mac); !slices.Equal(got, partDigests(t, parts)) {
			t.Errorf("Mac %s stores the parts %v, want every part with its hub file's digest %v", mac, got, partDigests(t, parts))
		}
	}
	w := gang.Spec.Split.Shards[1]
	want := partDigests(t, partsHolding(t, parts, int(w.FirstLayer), int(w.LastLayer)))
	if got := storedParts(t, w.Node); !slices.Equal(got, want) {
		t.Errorf("the worker's Mac %s (layers %d-%d) stores the parts %v, want %v", w.Node, w.FirstLayer, w.LastLayer, got, want)
	}
	t.Logf("the worker's Mac %s (layers %d-%d) stores %d of the %d parts", w.Node, w.FirstLayer, w.LastLayer, len(want), len(parts))
}

// partsHolding are the first of parts and those whose header declares a tensor of a
// layer first..last (blk.N.…).
func partsHolding(t *testing.T, parts []string, first, last int) []string {
	t.Helper()
	out := []string{parts[0]}
	for _, p := range parts[1:] {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		names, err := ggufheader.TensorNames(f, ggufheader.DefaultLimits)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if slices.ContainsFunc(names, func(n string) bool {
			for l := first; l <= last; l++ {
				if strings.HasPrefix(n, fmt.Sprintf("blk.%d.", l)) {
					return true
				}
			}
			return false
		}) {
			out = append(out, p)
		}
	}
	return out
}

// TestSplitWorkerFetchesOnlyItsParts: of a model stored in five parts, the Mac of a
// split replica's worker shard fetches the first part and the parts holding its
// layers, not the others, and the gang loads and serves from them.
func TestSplitWorkerFetchesOnlyItsParts(t *testing.T) {
	const repo = "org/split5-GGUF"
	parts := hubParts(t, repo, 5)
	ns := testenv.NewNamespace(t, fleet.Client)
	md := splitDeployment(ns, "split", 2, "parts5")
	md.Spec.Model.Source = "hf://" + repo + "/" + filepath.Base(parts[0])
	create(t, md)
	lm := layerMemoryOf(t, ns, "split")
	names := addSplitPool(t, "parts5", poolCeilings(t, lm, gangLayers(int64(lm.Layers), 2)...)...)
	t.Cleanup(func() { removeDeployment(t, ns, "split") })
	gang := checkGang(t, ns, "split", names)
	if got := greedy(t, gatewayClient(), ns+"/split", splitPrompts[0], false); got == "" {
		t.Error("the gang answered nothing")
	}
	w := gang.Spec.Split.Shards[1]
	want := partDigests(t, partsHolding(t, parts, int(w.FirstLayer), int(w.LastLayer)))
	if len(want) == len(parts) {
		t.Fatalf("layers %d-%d are in every part: the test selects nothing", w.FirstLayer, w.LastLayer)
	}
	if got := storedParts(t, w.Node); !slices.Equal(got, want) {
		t.Errorf("the worker's Mac %s (layers %d-%d) stores the parts %v, want %v", w.Node, w.FirstLayer, w.LastLayer, got, want)
	}
	if got := storedParts(t, gang.Spec.NodeName); !slices.Equal(got, partDigests(t, parts)) {
		t.Errorf("the head's Mac %s stores the parts %v, want every part %v", gang.Spec.NodeName, got, partDigests(t, parts))
	}
}

// estimatedMemory waits until a deployment's status carries its estimate and returns it.
func estimatedMemory(t *testing.T, ns, name string) int64 {
	t.Helper()
	var got int64
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &md); err != nil {
			return false, err.Error()
		}
		if md.Status.EstimatedMemory == nil {
			return false, fmt.Sprintf("deployment %s/%s has no estimate: %+v", ns, name, md.Status.Conditions)
		}
		got = md.Status.EstimatedMemory.Value()
		return true, ""
	})
	return got
}

// storedParts lists the parts a Mac's store names (parts/<hash>/NAME-0000i-of-0000N.gguf)
// as "NAME digest", the digest that of the file it links to, which the store named
// by the SHA-256 it verified as the download arrived: hashed again here.
func storedParts(t *testing.T, mac string) []string {
	t.Helper()
	a := fleet.Agent(mac)
	if a == nil {
		t.Fatalf("no Mac %s", mac)
	}
	links, err := filepath.Glob(filepath.Join(filepath.Dir(a.StateDir), "models", "parts", "*", "split-*-of-*.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		target, err := os.Readlink(l)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		digest := fileDigest(t, l)
		if !strings.HasSuffix(target, "sha256-"+digest) {
			t.Errorf("%s links to %s, whose content hashes to %s", l, target, digest)
		}
		out = append(out, filepath.Base(l)+" "+digest)
	}
	slices.Sort(out)
	return out
}

// partDigests are the hub's part files as storedParts lists them.
func partDigests(t *testing.T, parts []string) []string {
	t.Helper()
	var out []string
	for _, p := range parts {
		out = append(out, filepath.Base(p)+" "+fileDigest(t, p))
	}
	slices.Sort(out)
	return out
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestGatedModelFromTheHub: a model in a gated repository (the hub answers 401 to a
// request without the repository's token) is refused with a reason that names the
// fleet's hub token Secret while there is none; once an administrator writes the
// Secret, the manager estimates it with the token and the agent downloads it with
// the same token, and it serves.
func TestGatedModelFromTheHub(t *testing.T) {
	const repo, token = "org/gated-GGUF", "hf_fleet_token"
	dir := filepath.Join(fleet.HubDir, repo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ggufsynth.Write(filepath.Join(dir, modelFile), ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	fleet.Hub.Gate("/"+repo+"/", token)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: hubtoken.SecretName}}
	if err := fleet.Client.Delete(t.Context(), secret); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "gated", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = "hf://" + repo + "/" + modelFile
	}))

	secretName := v1alpha1.SystemNamespace + "/" + hubtoken.SecretName
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "gated"}, &md); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentProgressing)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonEstimateFailed &&
				strings.Contains(c.Message, "401") && strings.Contains(c.Message, "create the Secret "+secretName),
			fmt.Sprintf("want Progressing False, %s, naming the Secret %s: %+v", v1alpha1.ReasonEstimateFailed, secretName, md.Status.Conditions)
	})
	if rs := replicasOf(t, ns, "gated"); len(rs) != 0 {
		t.Errorf("a deployment without its estimate has replicas: %s", describeReplicas(rs))
	}

	secret.StringData = map[string]string{hubtoken.Key: token}
	if err := fleet.Client.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Client.Delete(context.Background(), secret); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting the hub token Secret: %v", err)
		}
	})
	// The manager and the agents read the Secret again within its TTL (a minute).
	waitReady(t, ns, "gated", 1, 3*time.Minute)
	if _, err := chat(t.Context(), gatewayClient(), ns+"/gated", false); err != nil {
		t.Fatalf("a chat with the gated model: %v", err)
	}
	download := "GET /" + repo + "/resolve/main/" + modelFile + " Bearer " + token
	if reqs := fleet.Hub.Requests(); !slices.Contains(reqs, download) {
		t.Errorf("the hub saw %q; want the agent's download %q", reqs, download)
	}
}
