package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/browsertest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// leaseShown is a Lease renewed seconds ago, as the fleet page says it.
var leaseShown = regexp.MustCompile(`^lease renewed [0-9]+s ago$`)

// bytesShown is the data-bytes of the element sel selects on the current page, "" when
// there is none (without waiting for one to appear).
func bytesShown(ctx context.Context, sel string) (string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {dataset: {}}).dataset.bytes || ""`, sel)))
}

// TestConsoleOnFleet opens the gateway's console in headless Chromium on the local
// fleet: both Macs with the memory numbers of their MacNode status, an unload that
// an idle OnDemand model triggers with the bytes it freed, and a playground answer
// streamed from a Resident model. Screenshots go to $ARTIFACTS/TestConsoleOnFleet.
func TestConsoleOnFleet(t *testing.T) {
	bin := browsertest.Chromium(t)
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "console-chat", 1))
	create(t, deployment(ns, "console-idle", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Residency = v1alpha1.ResidencyOnDemand
		md.Spec.IdleTimeout = &metav1.Duration{Duration: 3 * time.Second}
	}))
	waitReady(t, ns, "console-chat", 1, 3*time.Minute)
	idle := waitReady(t, ns, "console-idle", 1, 3*time.Minute)[0]

	art := browsertest.ArtifactDir(t)
	ctx := browsertest.New(t, bin, 5*time.Minute)
	ui := fleet.GatewayURL + "/ui"

	// Each Mac's ceiling and used bytes as the MacNode says (used moves with every
	// heartbeat, so the page and the API are read until they agree).
	for _, n := range []string{localfleetNode(0), localfleetNode(1)} {
		testenv.Eventually(t, time.Minute, 500*time.Millisecond, func() (bool, string) {
			if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/")); err != nil {
				return false, err.Error()
			}
			var mn v1alpha1.MacNode
			if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: n}, &mn); err != nil {
				return false, err.Error()
			}
			var shown []string
			for _, sel := range []string{"dd.used", "dd.ceiling"} {
				v, err := bytesShown(ctx, fmt.Sprintf(`tr[data-node=%q] %s`, n, sel))
				if err != nil {
					return false, err.Error()
				}
				shown = append(shown, v)
			}
			m := mn.Status.Memory
			want := []string{strconv.FormatInt(m.Used.Value(), 10), strconv.FormatInt(m.Ceiling.Value(), 10)}
			return shown[0] == want[0] && shown[1] == want[1],
				fmt.Sprintf("%s: the page shows used, ceiling %v; the MacNode says %v", n, shown, want)
		})
	}
	// Each agent renews its node Lease every few seconds; the page says how long ago.
	for _, n := range []string{localfleetNode(0), localfleetNode(1)} {
		lease, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(document.querySelector('tr[data-node=%q] small.lease') || {}).textContent || ""`, n)))
		if err != nil {
			t.Fatal(err)
		}
		if !leaseShown.MatchString(lease) {
			t.Errorf("%s: the page shows %q for its Lease; want it renewed seconds ago", n, lease)
		}
	}
	if err := chromedp.Do(ctx, browsertest.Screenshot(art, "fleet.png")); err != nil {
		t.Fatal(err)
	}
	// Page weight and time to render of the fleet page on the fleet, for
	// docs/benchmarks.md: a fresh load, its stylesheet and script cached as a browser
	// that refreshes has them.
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/"), chromedp.WaitVisible(chromedp.CSS(`svg.bar`))); err != nil {
		t.Fatal(err)
	}
	timing, err := browsertest.NavigationTiming(ctx)
	if err != nil {
		t.Fatal(err)
	}
	weight := 0
	for _, p := range []string{"/", "/static/console.css", "/static/console.js"} {
		resp, err := http.Get(ui + p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d, %v", ui+p, resp.StatusCode, err)
		}
		weight += len(b)
	}
	t.Logf("fleet page on the fleet (2 Macs): %d bytes with its stylesheet and script (uncompressed); %s", weight, timing)

	// The playground streams from the Resident model.
	browsertest.Playground(t, ctx, ui+"/playground", "console-chat", art, "playground.png")

	// The Resident model's prompt cache line: the runner's counters, which the gateway
	// reads from the replica's agent (cluster mode: the model named by the replica,
	// over the gateway's mutual TLS); nothing moved between Macs, as one replica holds
	// the model (a peer fetch needs a replica on another Mac holding the prefix).
	cacheLine := fmt.Sprintf(`section[aria-labelledby="d-%s-console-chat"] p.prompt-cache`, ns)
	testenv.Eventually(t, time.Minute, 500*time.Millisecond, func() (bool, string) {
		if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/models"), chromedp.WaitVisible(chromedp.CSS(`section.deployment`))); err != nil {
			return false, err.Error()
		}
		line, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, cacheLine)))
		if err != nil {
			return false, err.Error()
		}
		ok := regexp.MustCompile(`^prompt cache: hot (\d+%|—), SSD (\d+%|—), miss (\d+%|—) \(\d+ lookups\)`).MatchString(line) &&
			strings.Contains(line, "bytes from peers: none fetched") && !strings.Contains(line, "did not report")
		return ok, "the models page's prompt cache line of console-chat: " + line
	})

	// An unload: the OnDemand model loads on a request and unloads when idle; the
	// unloads page shows the bytes its agent reported.
	if _, err := chat(t.Context(), gatewayClient(), "console-idle", true); err != nil {
		t.Fatalf("a request to the OnDemand model: %v", err)
	}
	var freed int64
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		var cur v1alpha1.ModelReplica
		if err := fleet.Client.Get(t.Context(), client.ObjectKeyFromObject(&idle), &cur); err != nil {
			return false, err.Error()
		}
		u := cur.Status.LastUnload
		if u == nil || u.ResidentBytes == 0 {
			return false, fmt.Sprintf("no unload yet: %+v", u)
		}
		freed = u.FreedBytes
		return true, ""
	})
	row := fmt.Sprintf(`tr[data-replica=%q] td[data-bytes]`, ns+"/"+idle.Name)
	testenv.Eventually(t, 30*time.Second, 500*time.Millisecond, func() (bool, string) {
		if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/unloads")); err != nil {
			return false, err.Error()
		}
		v, err := bytesShown(ctx, row)
		if err != nil {
			return false, err.Error()
		}
		return v == strconv.FormatInt(freed, 10), fmt.Sprintf("the unloads page shows %q freed bytes for %s, the replica says %d", v, idle.Name, freed)
	})
	if err := chromedp.Do(ctx, browsertest.Screenshot(art, "unloads.png"),
		chromedp.Navigate(ui+"/models"), chromedp.WaitVisible(chromedp.CSS(`section.deployment`)),
		browsertest.Screenshot(art, "models.png")); err != nil {
		t.Fatal(err)
	}
}
