package chart

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// offline is how long the Mac of TestRejoinAfterThreeDaysOffline was away: longer than
// a node token's lifetime (24 h) and its certificate's.
const offline = 72 * time.Hour

// TestRejoinAfterThreeDaysOffline: a Mac of a local fleet (real API server, manager and
// agent processes) stops; its credential is then what three days offline leave, a
// token the API server issued for it that expired two days ago. Its agent, started
// again, cannot renew it and says so, naming the command that gives a new one; the
// step docs/upgrading.md documents (macfleet nodes credentials to the agent's
// --kubeconfig, then restart the agent) brings the Mac back: its Lease is renewed.
func TestRejoinAfterThreeDaysOffline(t *testing.T) {
	const mac = "mac-1"
	dir := t.TempDir()
	bin, runner, err := localfleet.Binaries(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	log := &strings.Builder{}
	fleet, err := localfleet.Start(ctx, localfleet.Options{Binary: bin, Runner: runner, Dir: filepath.Join(dir, "fleet"),
		Nodes: []localfleet.Node{{Name: mac, MemoryCeiling: "1Gi"}}, Log: log})
	if err != nil {
		t.Fatalf("starting the fleet: %v\n%s", err, log)
	}
	t.Cleanup(fleet.Stop)
	a := fleet.Agent(mac)
	if err := fleet.StopAgent(mac, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// Three days later: the token in the Mac's kubeconfig expired two days ago.
	expired := expiredToken(t, fleet.Env, setToken(t, a.Kubeconfig, ""), offline)
	setToken(t, a.Kubeconfig, expired)
	checkRefused(t, a.Kubeconfig, mac)

	restarted := time.Now()
	if err := fleet.StartAgent(mac); err != nil {
		t.Fatal(err)
	}
	hint := "macfleet nodes credentials " + mac
	testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		return strings.Contains(fleet.AgentLog(mac), hint),
			fmt.Sprintf("the agent with an expired credential never names %q; its log:\n%s", hint, fleet.AgentLog(mac))
	})
	if renewed := leaseRenewed(t, fleet, mac); renewed.After(restarted) {
		t.Errorf("the agent renewed its Lease at %s with an expired credential", renewed)
	}

	// The documented step: a new credential to the agent's --kubeconfig, a restart.
	if err := fleet.StopAgent(mac, 30*time.Second); err != nil {
		t.Logf("stopping the agent with the expired credential: %v", err)
	}
	out, err := exec.CommandContext(ctx, bin, "nodes", "credentials", mac, "--kubeconfig", fleet.AdminKubeconfig,
		"--server", fleet.APIServerURL(), "-o", a.Kubeconfig).CombinedOutput()
	if err != nil {
		t.Fatalf("macfleet nodes credentials %s: %v\n%s", mac, err, out)
	}
	rejoined := time.Now()
	if err := fleet.StartAgent(mac); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, 200*time.Millisecond, func() (bool, string) {
		renewed := leaseRenewed(t, fleet, mac)
		return renewed.After(rejoined), fmt.Sprintf("the Lease of %s was last renewed at %s, before the agent restarted with a new credential (%s); its log:\n%s",
			mac, renewed, rejoined, fleet.AgentLog(mac))
	})
	if err := fleet.WaitNodeReady(ctx, mac); err != nil {
		t.Fatalf("%v; the agent's log:\n%s", err, fleet.AgentLog(mac))
	}
}

// setToken sets the token of the kubeconfig's current user (when token is not empty)
// and returns the token it held before.
func setToken(t *testing.T, path, token string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	old := user.Token
	if token != "" {
		user.Token = token
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			t.Fatal(err)
		}
	}
	return old
}

// expiredToken returns token as the API server would have issued it age ago: the same
// header and claims, with its times moved back by age, signed by the API server's
// service account key.
func expiredToken(t *testing.T, env *testenv.Env, token string, age time.Duration) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("the node credential holds no JSON web token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"iat", "nbf", "exp"} {
		v, ok := claims[k].(float64)
		if !ok {
			t.Fatalf("the token has no %s claim: %v", k, claims)
		}
		claims[k] = int64(v) - int64(age/time.Second)
	}
	if exp := time.Unix(claims["exp"].(int64), 0); !exp.Before(time.Now()) {
		t.Fatalf("the token moved back %v still expires at %s, in the future", age, exp)
	}
	payload, err = json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	return signed + "." + base64.RawURLEncoding.EncodeToString(signES256(t, env.ServiceAccountSigningKey(), signed))
}

// signES256 signs data as a JSON web signature with the ECDSA P-256 key in the PEM file
// at path: r and s, 32 bytes each.
func signES256(t *testing.T, path, data string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	var key *ecdsa.PrivateKey
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		key, _ = k.(*ecdsa.PrivateKey)
	} else if key, err = x509.ParseECPrivateKey(block.Bytes); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if key == nil || key.Curve.Params().BitSize != 256 {
		t.Fatalf("%s is not an ECDSA P-256 key", path)
	}
	sum := sha256.Sum256([]byte(data))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return sig
}

// checkRefused fails unless the API server refuses the kubeconfig's credential as
// unauthenticated.
func checkRefused(t *testing.T, kubeconfig, mac string) {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoordinationV1().Leases(v1alpha1.NodeLeaseNamespace).Get(t.Context(), mac, metav1.GetOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Fatalf("the expired credential: %v, want Unauthorized", err)
	}
}

// leaseRenewed is when the Mac's agent last renewed its Lease.
func leaseRenewed(t *testing.T, fleet *localfleet.Fleet, mac string) time.Time {
	t.Helper()
	var l coordinationv1.Lease
	if err := fleet.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: mac}, &l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}
