package credentials_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// jwt is an unsigned token with claims, enough for ParseClaims.
func jwt(t *testing.T, claims any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return "e30." + base64.RawURLEncoding.EncodeToString(b) + ".sig"
}

func TestParseClaims(t *testing.T) {
	bound := jwt(t, map[string]any{"jti": "j1", "iat": 1000, "exp": 1000 + 86400, "kubernetes.io": map[string]any{
		"namespace": "macfleet-nodes", "serviceaccount": map[string]any{"name": "mac-a", "uid": "u1"},
		"secret": map[string]any{"name": "mac-a-credential", "uid": "s1"}}})
	unbound := jwt(t, map[string]any{"iat": 1000, "exp": 2000, "kubernetes.io": map[string]any{
		"namespace": "macfleet-nodes", "serviceaccount": map[string]any{"name": "mac-a"}}})
	tests := []struct {
		name, token string
		want        credentials.Claims
		wantErr     bool
	}{
		{name: "bound", token: bound, want: credentials.Claims{ID: "j1", IssuedAt: time.Unix(1000, 0), Expires: time.Unix(1000+86400, 0),
			Namespace: "macfleet-nodes", ServiceAccount: "mac-a", Secret: "mac-a-credential", SecretUID: "s1"}},
		{name: "unbound", token: unbound, want: credentials.Claims{IssuedAt: time.Unix(1000, 0), Expires: time.Unix(2000, 0),
			Namespace: "macfleet-nodes", ServiceAccount: "mac-a"}},
		{name: "not a JWT", token: "abc", wantErr: true},
		{name: "bad base64", token: "a.!!.c", wantErr: true},
	}
	for _, tt := range tests {
		got, err := credentials.ParseClaims(tt.token)
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestRenewAt(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		life, want time.Duration
	}{{24 * time.Hour, 19*time.Hour + 12*time.Minute}, {10 * time.Minute, 8 * time.Minute}, {48 * time.Hour, 38*time.Hour + 24*time.Minute}} {
		got := credentials.RenewAt(credentials.Claims{IssuedAt: t0, Expires: t0.Add(tt.life)})
		if got.Sub(t0) != tt.want {
			t.Errorf("RenewAt of a %v token = %v after issue, want %v", tt.life, got.Sub(t0), tt.want)
		}
	}
}

// TestRetryIn: a failed renewal is retried after a tenth of the token's remaining
// life, between a second and a minute, and every second once it has expired.
func TestRetryIn(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := credentials.Claims{IssuedAt: t0, Expires: t0.Add(24 * time.Hour)}
	for _, tt := range []struct {
		name string
		now  time.Time
		want time.Duration
	}{
		{name: "hours left: the longest wait", now: credentials.RenewAt(c), want: time.Minute},
		{name: "five minutes left: a tenth of them", now: c.Expires.Add(-5 * time.Minute), want: 30 * time.Second},
		{name: "five seconds left: at least a second", now: c.Expires.Add(-5 * time.Second), want: time.Second},
		{name: "expired: every second", now: c.Expires.Add(time.Hour), want: time.Second},
	} {
		if got := credentials.RetryIn(c, tt.now); got != tt.want {
			t.Errorf("%s: RetryIn = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestKubeconfigFile: the file a renewed token is written to is --kubeconfig, else
// $KUBECONFIG when it names a single file.
func TestKubeconfigFile(t *testing.T) {
	list := "/a/kc" + string(filepath.ListSeparator) + "/b/kc"
	for _, tt := range []struct {
		name, flag, env, want string
	}{
		{name: "the flag", flag: "/etc/node.kubeconfig", env: "/home/kc", want: "/etc/node.kubeconfig"},
		{name: "the flag beside a list", flag: "/etc/node.kubeconfig", env: list, want: "/etc/node.kubeconfig"},
		{name: "$KUBECONFIG naming one file", env: "/home/kc", want: "/home/kc"},
		{name: "$KUBECONFIG naming several: none", env: list, want: ""},
		{name: "neither: none (in-cluster)", want: ""},
	} {
		if got := credentials.KubeconfigFile(tt.flag, tt.env); got != tt.want {
			t.Errorf("%s: KubeconfigFile(%q, %q) = %q, want %q", tt.name, tt.flag, tt.env, got, tt.want)
		}
	}
}

func TestNewRotatorRefusesWhatItCannotRenew(t *testing.T) {
	unbound := jwt(t, map[string]any{"iat": 1, "exp": 2, "kubernetes.io": map[string]any{"serviceaccount": map[string]any{"name": "a"}}})
	for name, rc := range map[string]*rest.Config{
		"no token":         {Host: "https://x"},
		"a token file":     {Host: "https://x", BearerToken: unbound, BearerTokenFile: "/var/run/token"},
		"an unbound token": {Host: "https://x", BearerToken: unbound},
		"not a JWT":        {Host: "https://x", BearerToken: "static"},
	} {
		before := *rc
		if _, err := credentials.NewRotator(rc, "", testr.New(t)); err != credentials.ErrNotRenewable {
			t.Errorf("%s: err = %v, want ErrNotRenewable", name, err)
		}
		if rc.BearerToken != before.BearerToken || rc.WrapTransport != nil {
			t.Errorf("%s: the rest.Config was changed", name)
		}
	}
}

// TestRotatorRenewsAndRevokeEndsEveryToken: the agent renews its bound token as
// itself (its clients switch to the new one, the kubeconfig is rewritten), and
// `macfleet nodes revoke` ends the old and the renewed token alike.
func TestRotatorRenewsAndRevokeEndsEveryToken(t *testing.T) {
	install(t)
	forget(t, "mac-rot")
	_, cred := issue(t, "mac-rot")
	path := filepath.Join(t.TempDir(), "mac-rot.kubeconfig")
	if err := credentials.WriteFile(path, cred.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	first := rc.BearerToken
	claims, err := credentials.ParseClaims(first)
	if err != nil {
		t.Fatal(err)
	}
	if claims.Secret != credentials.BindingSecretName("mac-rot") || claims.Expires.Sub(claims.IssuedAt) != credentials.DefaultDuration {
		t.Fatalf("issued token claims %+v: want bound to %s for %v", claims, credentials.BindingSecretName("mac-rot"), credentials.DefaultDuration)
	}
	rot, err := credentials.NewRotator(rc, path, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	waitForPolicy(t, c)
	if err := rot.Renew(t.Context()); err != nil {
		t.Fatalf("renewing as the node itself: %v", err)
	}
	renewed, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.BearerToken == first || renewed.BearerToken == "" {
		t.Fatal("the kubeconfig still holds the first token")
	}
	if got := rot.Claims(); got.Secret != claims.Secret || got.SecretUID != claims.SecretUID || got.Expires.Sub(got.IssuedAt) != credentials.DefaultDuration {
		t.Errorf("renewed token claims %+v: want bound like the first (%+v) for %v", got, claims, credentials.DefaultDuration)
	}
	lease := func(c client.Client) error {
		err := c.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: "none"}, &coordinationv1.Lease{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if err := lease(c); err != nil {
		t.Fatalf("the agent's client after renewal: %v", err)
	}

	if err := credentials.Revoke(t.Context(), kubernetes.NewForConfigOrDie(env.Config), "mac-rot"); err != nil {
		t.Fatal(err)
	}
	stolen := map[string]string{"first": first, "renewed": renewed.BearerToken}
	for name, tok := range stolen {
		src := rest.AnonymousClientConfig(env.Config) // the API server's address and CA, no admin credential
		src.BearerToken = tok
		sc, err := client.New(src, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			err := lease(sc)
			return apierrors.IsUnauthorized(err), "the " + name + " token after revocation: " + errString(err)
		})
	}
	if err := rot.Renew(t.Context()); err == nil {
		t.Error("a revoked node renewed its token")
	}
	// A new credential works again.
	if _, err := credentials.Issue(t.Context(), kubernetes.NewForConfigOrDie(env.Config), env.Config, "mac-rot", credentials.Options{}); err != nil {
		t.Fatalf("issuing after revocation: %v", err)
	}
}

// TestNodeTokenRequestsConfined: a node may request tokens only for itself, bound to
// its own binding Secret, for the API server, for at most 48h.
func TestNodeTokenRequestsConfined(t *testing.T) {
	install(t)
	forget(t, "mac-tr", "mac-tr-other")
	a, _ := issue(t, "mac-tr")
	issue(t, "mac-tr-other")
	waitForPolicy(t, a)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	secret := func(node string) *metav1.ObjectMeta {
		s, err := cs.CoreV1().Secrets(v1alpha1.NodeIdentityNamespace).Get(t.Context(), credentials.BindingSecretName(node), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &s.ObjectMeta
	}
	own, other := secret("mac-tr"), secret("mac-tr-other")
	req := func(bound *metav1.ObjectMeta, seconds int64, aud ...string) *authenticationv1.TokenRequest {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds, Audiences: aud}}
		if bound != nil {
			tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		return tr
	}
	tests := []struct {
		name, sa string
		tr       *authenticationv1.TokenRequest
		wantErr  string
	}{
		{"its own, bound", "mac-tr", req(own, 86400), ""},
		{"another node's", "mac-tr-other", req(other, 86400), "may only renew its own token"},
		{"its own, unbound", "mac-tr", req(nil, 86400), "may only renew its own token"},
		{"its own, bound to another node's Secret", "mac-tr", req(other, 86400), "may only renew its own token"},
		{"its own, for a year", "mac-tr", req(own, 365*86400), "may only renew its own token"},
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(func() []byte {
		_, cred := issue(t, "mac-tr")
		return cred.Kubeconfig
	}())
	if err != nil {
		t.Fatal(err)
	}
	nodeCS := kubernetes.NewForConfigOrDie(rc)
	for _, tt := range tests {
		_, err := nodeCS.CoreV1().ServiceAccounts(v1alpha1.NodeIdentityNamespace).CreateToken(t.Context(), tt.sa, tt.tr, metav1.CreateOptions{})
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: got %s, want %q", tt.name, errString(err), tt.wantErr)
		}
	}
}

// TestRotatorRunRenewsWhenDue: Run waits until 80% of the token's lifetime (a fake
// clock) and then renews it against the real API server.
func TestRotatorRunRenewsWhenDue(t *testing.T) {
	install(t)
	forget(t, "mac-run")
	_, cred := issue(t, "mac-run")
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rot, err := credentials.NewRotator(rc, "", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	first := rot.Claims()
	clk := clocktesting.NewFakeClock(first.IssuedAt)
	rot.Clock = clk
	c, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	waitForPolicy(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rot.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "Run is not waiting"
	})
	clk.SetTime(credentials.RenewAt(first).Add(-time.Second))
	if got := rot.Claims(); got != first {
		t.Fatalf("renewed before it was due: %+v", got)
	}
	clk.SetTime(credentials.RenewAt(first))
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		got := rot.Claims()
		return got.ID != first.ID && got.ID != "", "not renewed at RenewAt"
	})
}
