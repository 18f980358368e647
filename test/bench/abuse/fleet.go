package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// The fleet under test: one simulated Mac serving one deployment (a random-weight
// model with the real Llama 3 vocabulary: real tokenization, answers that run to
// max_tokens), two gateway processes with tenant keys, and one team namespace whose
// keys each have a TokenBudget of their own.

const (
	namespace  = "abuse"
	deployName = "chat"
	modelFile  = "llama31-vocab.gguf"

	keyOne   = "one"   // the budget phase through one gateway
	keyTwo   = "two"   // the budget phase over both
	keyLater = "later" // over both, the second gateway's streams a second later
	keyHot   = "hot"   // the latency phases: a budget no request reaches
	keyProbe = "probe" // a zero budget: each gateway has read the budgets once it refuses it
)

// hotBudget is the hot key's tokens a minute: budgeted (the reservation's path runs),
// never refused.
const hotBudget = 1 << 40

type benchFleet struct {
	f    *localfleet.Fleet
	dir  string
	keep bool
	urls []string
	// keys are the API keys by their Secret's name.
	keys map[string]string
}

func (b *benchFleet) stop() {
	b.f.Stop()
	if !b.keep {
		_ = os.RemoveAll(b.dir)
	}
}

// startFleet starts the fleet, deploys the model, creates the keys and their budgets,
// and waits until both gateways serve the model and have read the budgets.
func startFleet(ctx context.Context, o options) (*benchFleet, error) {
	ctrl.SetLogger(logr.Discard()) // the harness's own API clients
	dir, err := os.MkdirTemp("", "macfleet-bench-abuse-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		fmt.Fprintln(o.out, "fleet directory:", dir)
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	f, err := localfleet.Start(startCtx, localfleet.Options{Binary: o.macfleet, Runner: o.runner, Dir: dir,
		Nodes:    []localfleet.Node{{Name: "mac-1", MemoryCeiling: "2Gi", Chip: "Apple M2 Pro (simulated)", UnifiedMemory: "32Gi"}},
		Gateways: 2, GatewayArgs: []string{"--tenant-keys"}, Log: os.Stderr})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the fleet: %w", err)
	}
	b := &benchFleet{f: f, dir: dir, keep: o.keep, urls: f.GatewayURLs, keys: map[string]string{}}
	if err := b.setUp(startCtx, o); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// setUp deploys the model and creates the keys and budgets.
func (b *benchFleet) setUp(ctx context.Context, o options) error {
	spec, err := testassets.Llama31Spec()
	if err != nil {
		return err
	}
	if err := ggufsynth.Write(filepath.Join(b.f.ModelsDir, modelFile), spec); err != nil {
		return err
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deployName},
			Spec: v1alpha1.ModelDeploymentSpec{
				Model:    v1alpha1.ModelSource{Source: b.f.ModelsURL + "/" + modelFile},
				Engine:   v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 4 * 512, Parallel: 4}},
				Replicas: ptr.To[int32](1),
			}},
	}
	for name, limit := range map[string]int64{keyOne: o.budget, keyTwo: o.budget, keyLater: o.budget, keyHot: hotBudget, keyProbe: 0} {
		b.keys[name] = rand.Text()
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Type: tenancy.SecretType,
			Data: map[string][]byte{tenancy.KeyField: []byte(b.keys[name])}},
			&v1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
				Spec: v1alpha1.TokenBudgetSpec{Key: name, TokensPerMinute: ptr.To(limit)}})
	}
	for _, obj := range objs {
		if err := b.f.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
	}
	for _, url := range b.urls {
		if err := b.waitServes(ctx, url); err != nil {
			return err
		}
	}
	return nil
}

// waitServes waits until the gateway at url answers the hot key's one-token request
// and refuses the probe key's (its zero budget, created with the others: the
// gateway has read the budgets).
func (b *benchFleet) waitServes(ctx context.Context, url string) error {
	var last string
	c := &http.Client{Timeout: 30 * time.Second}
	return localfleet.Poll(ctx, 4*time.Minute, func() (bool, error) {
		code, body, err := post(ctx, c, url, b.keys[keyHot], oneToken)
		if last = fmt.Sprintf("the hot key: %d %s %v", code, body, err); code != http.StatusOK {
			return false, nil
		}
		code, body, err = post(ctx, c, url, b.keys[keyProbe], oneToken)
		last = fmt.Sprintf("the probe key: %d %s %v", code, body, err)
		return code == http.StatusTooManyRequests, nil
	}, func() string { return url + " to serve " + deployName + " and apply the budgets: " + last })
}

// fileLimit is the process's limit of open files: soft (as raised) and hard.
type fileLimit struct {
	Was, Soft, Hard uint64
}

func (l fileLimit) String() string {
	if l.Was == l.Soft {
		return fmt.Sprintf("soft limit %d (hard %d)", l.Soft, l.Hard)
	}
	return fmt.Sprintf("soft limit raised from %d to %d (hard %d)", l.Was, l.Soft, l.Hard)
}

// raiseFileLimit lifts the soft limit of open files to at least n, within the hard
// limit, and fails naming both when the hard limit is below n.
func raiseFileLimit(n uint64) (fileLimit, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fileLimit{}, err
	}
	l := fileLimit{Was: lim.Cur, Soft: lim.Cur, Hard: lim.Max}
	if lim.Cur >= n {
		return l, nil
	}
	if lim.Max < n {
		return l, fmt.Errorf("the hard limit of open files is %d; this run needs %d (lower -idle, or raise it with ulimit -Hn)", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return l, fmt.Errorf("raising the limit of open files to %d: %w", n, err)
	}
	l.Soft = n
	return l, nil
}
