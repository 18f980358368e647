package hubtoken_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/agent/hubtoken"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env, testenv.WithScheme(mfv1.AddToScheme)) }

// TestTokenWithANodeCredential: a Mac's own credential reads the fleet's hub token
// Secret and no other Secret of macfleet-system; the token follows the Secret once a
// TTL has passed (written, rotated, deleted), and a read the API refuses keeps the
// last token and is logged once.
func TestTokenWithANodeCredential(t *testing.T) {
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	if err := env.Apply(ctx, "config/agent", "config/admission"); err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(env.Config)
	cred, err := credentials.Issue(ctx, admin, env.Config, "mac-hub", credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	node := kubernetes.NewForConfigOrDie(rc)
	var logged []string
	clk := clocktesting.NewFakeClock(time.Now())
	src := &hubtoken.Source{Clientset: node, Clock: clk,
		Log: funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})}
	next := func() string { clk.Step(hubtoken.DefaultTTL); return src.Token(ctx) }

	if got := src.Token(ctx); got != "" {
		t.Errorf("without the Secret: %q", got)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: hubtoken.SecretName},
		StringData: map[string]string{hubtoken.Key: "hf_fleet\n"}}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if got := src.Token(ctx); got != "" {
		t.Errorf("within the TTL of the last read: %q, want the read kept", got)
	}
	if got := next(); got != "hf_fleet" {
		t.Errorf("after the TTL: %q, want hf_fleet", got)
	}
	sec.StringData = map[string]string{hubtoken.Key: "hf_rotated"}
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "hf_rotated" {
		t.Errorf("after a rotation: %q", got)
	}

	// The same credential reads no other Secret there.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: "macfleet-other"}}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := node.CoreV1().Secrets(mfv1.SystemNamespace).Get(ctx, other.Name, metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("a node reading another Secret of %s: %v; want forbidden", mfv1.SystemNamespace, err)
	}
	if _, err := node.CoreV1().Secrets(mfv1.SystemNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("a node lists the Secrets of " + mfv1.SystemNamespace)
	}

	// A read the API refuses (the grant removed) keeps the last token, logged once.
	if err := admin.RbacV1().RoleBindings(mfv1.SystemNamespace).Delete(ctx, "macfleet-agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Apply(context.Background(), "config/agent") })
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, err := node.CoreV1().Secrets(mfv1.SystemNamespace).Get(ctx, hubtoken.SecretName, metav1.GetOptions{})
		return err != nil, "the node still reads the Secret"
	})
	for range 2 {
		if got := next(); got != "hf_rotated" {
			t.Errorf("after a refused read: %q, want the last token kept", got)
		}
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "forbidden") {
		t.Errorf("logged %q, want the refusal once", logged)
	}

	// Deleted: no token.
	if err := env.Apply(ctx, "config/agent"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		got := next()
		return got == "", "token " + got + " after the Secret was deleted"
	})
}
