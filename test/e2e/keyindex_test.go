package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestKeysWhileTheManagerIsDown: the gateways read the teams' keys from the index the
// manager publishes (docs/tenancy.md, "How keys reach the gateway"). With the manager
// killed, a gateway that starts then still accepts the keys of the last index, a key
// deleted meanwhile still works and one created meanwhile is refused; once the manager
// is back, both changes reach the gateways within 5 s.
func TestKeysWhileTheManagerIsDown(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	kept, revoked, added := newKey(t), newKey(t), newKey(t)
	createKey(t, ns, "kept", kept)
	s := createKey(t, ns, "revoked", revoked)
	before, _ := inProcessGateway(t, gateway.Config{TenantKeys: true, NoServiceAccountTokens: true}, testr.New(t))
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		a, b := rawGet(t, before+"/v1/models", kept), rawGet(t, before+"/v1/models", revoked)
		return a == http.StatusOK && b == http.StatusOK, fmt.Sprintf("both keys with the manager up: %d, %d", a, b)
	})

	if err := fleet.KillManager(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := fleet.RestartManager(context.Background()); err != nil {
				t.Errorf("restarting the manager: %v", err)
			}
		}
	})
	if err := fleet.Client.Delete(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	createKey(t, ns, "added", added)
	// A gateway that starts now reads the last index: it is ready and accepts its keys.
	during, _ := inProcessGateway(t, gateway.Config{TenantKeys: true, NoServiceAccountTokens: true}, testr.New(t))
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		code := rawGet(t, during+"/v1/models", kept)
		return code == http.StatusOK, fmt.Sprintf("a key through a gateway started with the manager down: %d", code)
	})
	for _, base := range []string{before, during} {
		if code := rawGet(t, base+"/v1/models", revoked); code != http.StatusOK {
			t.Errorf("%s: the key deleted while the manager is down: %d, want 200 (the last index holds it)", base, code)
		}
		if code := rawGet(t, base+"/v1/models", added); code != http.StatusUnauthorized {
			t.Errorf("%s: the key created while the manager is down: %d, want 401 (no index holds it yet)", base, code)
		}
	}

	back := time.Now()
	if err := fleet.RestartManager(t.Context()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("the manager was ready again after %v", time.Since(back).Round(time.Millisecond))
	ready := time.Now()
	for _, base := range []string{before, during} {
		testenv.Eventually(t, keyWait, 20*time.Millisecond, func() (bool, string) {
			a, r := rawGet(t, base+"/v1/models", added), rawGet(t, base+"/v1/models", revoked)
			return a == http.StatusOK && r == http.StatusUnauthorized,
				fmt.Sprintf("%s with the manager back: the added key %d (want 200), the deleted one %d (want 401)", base, a, r)
		})
	}
	t.Logf("both changes reached the gateways %v after the manager was ready", time.Since(ready).Round(time.Millisecond))
}
