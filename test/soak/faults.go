package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
)

// Chaos applies a fault schedule to a local fleet.
type Chaos struct {
	Fleet *localfleet.Fleet
	// Namespace holds the deployments the faults create.
	Namespace string
	// StoreCapacity is the agents' --store-capacity: what a full disk holds.
	StoreCapacity int64
	// Deployment builds a deployment of a model file in the fleet's model directory.
	Deployment func(name, file string) *v1alpha1.ModelDeployment
	Log        func(format string, args ...any)

	// Applied are the faults done, with what was observed.
	Applied []string
}

// Run applies each fault at its planned time from start; it stops at the first fault
// that could not be applied or whose effect the fleet did not report.
func (c *Chaos) Run(ctx context.Context, start time.Time, plan []Fault) error {
	for i, f := range plan {
		if err := waitUntil(ctx, start.Add(f.At)); err != nil {
			return err
		}
		c.Log("fault %d/%d: %s", i+1, len(plan), f)
		note, err := c.apply(ctx, i, f, start.Add(f.End()))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		c.Applied = append(c.Applied, fmt.Sprintf("%s: %s", f, note))
	}
	return nil
}

// waitUntil waits for a planned time.
func waitUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func (c *Chaos) apply(ctx context.Context, i int, f Fault, end time.Time) (string, error) {
	fl := c.Fleet
	switch f.Kind {
	case KillAgent:
		if err := fl.KillAgent(f.Node); err != nil {
			return "", err
		}
		if err := waitUntil(ctx, end); err != nil {
			return "", err
		}
		return "killed and restarted", fl.StartAgent(f.Node)
	case KillRunner:
		note, err := c.killRunner(f.Node)
		if err != nil {
			return "", err
		}
		return note, waitUntil(ctx, end)
	case KillManager:
		if err := fl.KillManager(); err != nil {
			return "", err
		}
		if err := waitUntil(ctx, end); err != nil {
			return "", err
		}
		return "killed and restarted", fl.RestartManager(ctx)
	case KillGateway:
		if err := fl.KillGateway(f.Gateway); err != nil {
			return "", err
		}
		if err := waitUntil(ctx, end); err != nil {
			return "", err
		}
		return "killed and restarted", fl.RestartGateway(ctx, f.Gateway)
	case CutAPIServer:
		fl.CutAPIServer()
		if err := waitUntil(ctx, end); err != nil {
			return "", err
		}
		return "cut and restored", fl.RestoreAPIServer()
	case FillDisk:
		return c.fillDisk(ctx, i, f.Node, end)
	case CorruptModel:
		return c.corruptModel(ctx, i, end)
	}
	return "", fmt.Errorf("unknown fault %q", f.Kind)
}

// killRunner kills a runner of the node (of another node when it runs none).
func (c *Chaos) killRunner(node string) (string, error) {
	runners, err := c.Fleet.Runners()
	if err != nil {
		return "", err
	}
	if len(runners) == 0 {
		return "no runner to kill", nil
	}
	slices.SortFunc(runners, func(a, b localfleet.Runner) int { return a.PID - b.PID })
	victim := runners[0]
	for _, r := range runners {
		if r.Node == node {
			victim = r
			break
		}
	}
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("killing runner %d: %w", victim.PID, err)
	}
	return fmt.Sprintf("killed runner %d of %s (%s)", victim.PID, victim.Node, filepath.Base(victim.Model)), nil
}

// fillDisk fills the node's model store to its capacity (a sparse file: the
// capacity counts its size, the disk holds none of it), deploys a model the node
// does not have there, waits for its agent to report the full disk, and frees the
// space. The deployment stays: the final convergence checks that it recovered.
func (c *Chaos) fillDisk(ctx context.Context, i int, nodeName string, end time.Time) (string, error) {
	a := c.Fleet.Agent(nodeName)
	if a == nil {
		return "", fmt.Errorf("no Mac %s", nodeName)
	}
	filler := filepath.Join(filepath.Dir(a.StateDir), "models", "soak-filler")
	f, err := os.Create(filler)
	if err != nil {
		return "", err
	}
	err = f.Truncate(c.StoreCapacity)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	var n v1alpha1.MacNode
	if err := c.Fleet.Client.Get(ctx, client.ObjectKey{Name: nodeName}, &n); err != nil {
		return "", err
	}
	name := fmt.Sprintf("fill-%d", i)
	spec := ggufsynth.Tiny()
	spec.Seed = uint64(1000 + i) // bytes no store has yet
	if err := ggufsynth.Write(filepath.Join(c.Fleet.ModelsDir, name+".gguf"), spec); err != nil {
		return "", err
	}
	md := c.Deployment(name, name+".gguf")
	md.Spec.Replicas = ptr.To[int32](1)
	md.Spec.Residency = v1alpha1.ResidencyOnDemand
	md.Spec.Placement.NodeSelector = map[string]string{v1alpha1.LabelChip: n.Labels[v1alpha1.LabelChip]}
	if err := c.Fleet.Client.Create(ctx, md); err != nil {
		return "", err
	}
	msg, err := c.waitReplicaCondition(ctx, name, end, func(r *v1alpha1.ModelReplica) (string, bool) {
		cd := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaDownloaded)
		if cd != nil && cd.Status == metav1.ConditionFalse && strings.Contains(cd.Message, "disk space") {
			return cd.Reason + ": " + cd.Message, true
		}
		return "", false
	})
	if rerr := os.Remove(filler); err == nil {
		err = rerr
	}
	if err != nil {
		return "", fmt.Errorf("the agent of %s: %w", nodeName, err)
	}
	if err := waitUntil(ctx, end); err != nil {
		return "", err
	}
	return "reported " + msg + "; freed", nil
}

// corruptModel deploys a model whose file the server serves with bytes flipped
// (its sha256 is the genuine file's), waits for the deployment's ReplicaFailure and
// deletes it.
func (c *Chaos) corruptModel(ctx context.Context, i int, end time.Time) (string, error) {
	name := fmt.Sprintf("corrupt-%d", i)
	path := filepath.Join(c.Fleet.ModelsDir, name+".gguf")
	spec := ggufsynth.Tiny()
	spec.Seed = uint64(2000 + i)
	if err := ggufsynth.Write(path, spec); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256Hex(b)
	for j := len(b) / 2; j < len(b)/2+64; j++ {
		b[j] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	md := c.Deployment(name, name+".gguf")
	md.Spec.Model.SHA256 = sum
	if err := c.Fleet.Client.Create(ctx, md); err != nil {
		return "", err
	}
	var msg string
	err = localfleet.Poll(ctx, time.Until(end), func() (bool, error) {
		var cur v1alpha1.ModelDeployment
		if err := c.Fleet.Client.Get(ctx, client.ObjectKeyFromObject(md), &cur); err != nil {
			return false, err
		}
		cd := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		if cd != nil && cd.Status == metav1.ConditionTrue {
			msg = cd.Reason + ": " + cd.Message
			return true, nil
		}
		return false, nil
	}, func() string { return "a ReplicaFailure on deployment " + name })
	if err != nil {
		return "", err
	}
	if err := waitUntil(ctx, end); err != nil {
		return "", err
	}
	if err := c.Fleet.Client.Delete(ctx, md); err != nil {
		return "", err
	}
	// The local fleet runs no garbage collector (a cluster's kube-controller-manager
	// deletes the replicas the deployment owns): do its part.
	if err := c.Fleet.Client.DeleteAllOf(ctx, &v1alpha1.ModelReplica{}, client.InNamespace(c.Namespace),
		client.MatchingLabels{v1alpha1.LabelDeployment: name}); err != nil {
		return "", err
	}
	return "ReplicaFailure " + msg + "; deleted", nil
}

// waitReplicaCondition polls the replicas of a deployment until one satisfies ok.
func (c *Chaos) waitReplicaCondition(ctx context.Context, deployment string, deadline time.Time,
	ok func(*v1alpha1.ModelReplica) (string, bool)) (string, error) {
	var msg string
	err := localfleet.Poll(ctx, time.Until(deadline), func() (bool, error) {
		var list v1alpha1.ModelReplicaList
		if err := c.Fleet.Client.List(ctx, &list, client.InNamespace(c.Namespace),
			client.MatchingLabels{v1alpha1.LabelDeployment: deployment}); err != nil {
			return false, err
		}
		for i := range list.Items {
			if m, done := ok(&list.Items[i]); done {
				msg = m
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "a replica of deployment " + deployment + " to report its full disk" })
	return msg, err
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
