package gateway_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/browsertest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func value(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// setMemory writes a Mac's memory status as its agent would.
func (f *fleet) setMemory(name, chip string, m mfv1.NodeMemoryStatus) {
	f.t.Helper()
	n := &mfv1.MacNode{}
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: name}, n); err != nil {
		f.t.Fatal(err)
	}
	n.Status.Hardware.Chip = chip
	n.Status.Memory = m
	if err := f.c.Status().Update(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
}

// updateReplica applies change to a replica's status as its agent would.
func (f *fleet) updateReplica(name string, change func(*mfv1.ModelReplicaStatus)) {
	f.t.Helper()
	r := &mfv1.ModelReplica{}
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, r); err != nil {
		f.t.Fatal(err)
	}
	change(&r.Status)
	if err := f.c.Status().Update(f.t.Context(), r); err != nil {
		f.t.Fatal(err)
	}
}

// TestConsoleInBrowser drives the console in headless Chromium against a gateway fed
// by the API server, with a real agent behind the playground: sign in with an API
// key, both Macs with the memory numbers of their MacNode status, a live refresh when
// one changes, the unload with its freed bytes, and a streamed playground answer.
// Screenshots of each page are written to the artifact directory.
func TestConsoleInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	e, agent, keys := realAgent(t, "console-key")
	g := startGateway(t, e, gateway.Config{APIKeysFile: keys, ColdStartTimeout: 30 * time.Second})
	g.key = "console-key"

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	macA, macB := "mac-a-"+f.ns, "mac-b-"+f.ns
	gib := func(n float64) *resource.Quantity { return resource.NewQuantity(int64(n*(1<<30)), resource.BinarySI) }
	f.node(macA, metav1.ConditionTrue)
	f.setMemory(macA, "Apple M2 Pro", mfv1.NodeMemoryStatus{Ceiling: gib(12), SoftWatermark: gib(10), HardWatermark: gib(11),
		Used: gib(3.5), Committed: gib(2), Pressure: mfv1.PressureOK, Evictions: 1, FreedBytesTotal: 123456789})
	f.node(macB, metav1.ConditionTrue)
	f.setMemory(macB, "Apple M4 Max", mfv1.NodeMemoryStatus{Ceiling: gib(48), SoftWatermark: gib(40), HardWatermark: gib(44),
		Used: gib(1.25), Pressure: mfv1.PressureOK})
	f.deployment("tiny", "", 1)
	f.replica("tiny-0", "tiny", macA)
	f.setReplica("tiny-0", metav1.ConditionTrue, agent)
	f.updateReplica("tiny-0", func(s *mfv1.ModelReplicaStatus) {
		s.Phase = mfv1.ReplicaRunning
		s.Memory.Resident = gib(1.5)
		s.LastUnload = &mfv1.UnloadReport{Reason: "Pressure", FreedBytes: 123456789, ResidentBytes: 130000000,
			Outcome: mfv1.UnloadSettled, Duration: metav1.Duration{Duration: 850 * time.Millisecond}, Time: metav1.Now()}
	})
	waitModel(t, g, "tiny", f.ns, 1)

	art := browsertest.ArtifactDir(t)
	shot := func(name string) chromedp.Action[chromedp.Void] { return browsertest.Screenshot(art, name) }
	ctx := browsertest.New(t, bin, 4*time.Minute)
	row := func(mac, sel string) chromedp.CSS { return chromedp.CSS(fmt.Sprintf(`tr[data-node=%q] %s`, mac, sel)) }

	// Signing in: the console sends a browser without the cookie to the form.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(g.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), "console-key"),
		chromedp.Click(chromedp.CSS(`form.login button`)),
		chromedp.WaitVisible(row(macB, "svg.bar")),
	); err != nil {
		t.Fatalf("signing in: %v", err)
	}

	// Both Macs, with the numbers of their MacNode status.
	for _, mac := range []string{macA, macB} {
		n := &mfv1.MacNode{}
		if err := e.Client.Get(t.Context(), client.ObjectKey{Name: mac}, n); err != nil {
			t.Fatal(err)
		}
		for sel, want := range map[string]*resource.Quantity{"dd.used": n.Status.Memory.Used,
			"dd.ceiling": n.Status.Memory.Ceiling, "dd.committed": n.Status.Memory.Committed} {
			got, err := chromedp.Run(ctx, chromedp.AttributeValue(row(mac, sel), "data-bytes"))
			if err != nil {
				t.Fatalf("%s %s: %v", mac, sel, err)
			}
			if w := strconv.FormatInt(value(want), 10); got.Value != w {
				t.Errorf("%s %s shows %q bytes, the MacNode says %s", mac, sel, got.Value, w)
			}
		}
	}
	label, err := chromedp.Run(ctx, chromedp.AttributeValue(row(macA, "svg.bar"), "aria-label"))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, shot("console-fleet.png")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"3.5 GiB used of 12.0 GiB ceiling", "tiny 1.5 GiB", "soft watermark 10.0 GiB"} {
		if !strings.Contains(label.Value, want) {
			t.Errorf("the memory bar of %s says %q, want it to mention %q", macA, label.Value, want)
		}
	}

	// Live: the page follows the MacNode without a reload.
	f.setMemory(macB, "Apple M4 Max", mfv1.NodeMemoryStatus{Ceiling: gib(48), SoftWatermark: gib(40), HardWatermark: gib(44),
		Used: gib(7), Pressure: mfv1.PressureOK})
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector(%q).dataset.bytes === %q`,
		string(row(macB, "dd.used")), strconv.FormatInt(gib(7).Value(), 10)), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Errorf("the fleet page did not follow the MacNode's used memory: %v", err)
	}

	// The unload and its freed bytes.
	if err := chromedp.Do(ctx, chromedp.Navigate(g.url+"/ui/unloads"), chromedp.WaitVisible(chromedp.CSS(`main table`))); err != nil {
		t.Fatal(err)
	}
	unloads, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`main table tbody`)))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, shot("console-unloads.png"),
		chromedp.Navigate(g.url+"/ui/models"),
		chromedp.WaitVisible(chromedp.CSS(`section.deployment`)),
		shot("console-models.png"),
	); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tiny", macA, "Pressure", "117.7 MiB", "Settled", "850ms"} {
		if !strings.Contains(unloads, want) {
			t.Errorf("the unloads table lacks %q:\n%s", want, unloads)
		}
	}

	// The playground streams an answer from the real agent through the gateway.
	browsertest.Playground(t, ctx, g.url+"/ui/playground", "tiny", art, "console-playground.png")

	// The models page counts the playground's request among the deployment's traffic
	// through this gateway.
	if err := chromedp.Do(ctx, chromedp.Navigate(g.url+"/ui/models"), chromedp.WaitVisible(chromedp.CSS(`p.traffic`))); err != nil {
		t.Fatal(err)
	}
	traffic, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`p.traffic`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(traffic, "req/s") || !regexp.MustCompile(`TTFT p50 \d+ ms, p99 \d+ ms \([1-9]\d* requests?\)`).MatchString(traffic) ||
		!strings.Contains(traffic, "0 queued") {
		t.Errorf("the models page's traffic line after a playground chat: %q", traffic)
	}

	// The prompt cache's hit rate by tier, from the runner's counters through its agent:
	// the same conversation again finds its prefix in the hot tier. Bytes from
	// peers read "none fetched": this gateway has no second Mac to fetch from.
	long := strings.Repeat("The fleet keeps this system prompt in its cache. ", 8)
	chat := `{"model":"tiny","max_tokens":2,"messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"hi"}]}`
	hotRate := regexp.MustCompile(`prompt cache: hot [1-9]\d*%, SSD \d+%, miss \d+% \([1-9]\d* lookups\)`)
	var cacheLine string
	testenv.Eventually(t, 2*time.Minute, 500*time.Millisecond, func() (bool, string) {
		if code, body := send(http.MethodPost, g.url+"/v1/chat/completions", chat, g.key); code != http.StatusOK {
			return false, fmt.Sprintf("chat: %d %s", code, body)
		}
		if err := chromedp.Do(ctx, chromedp.Navigate(g.url+"/ui/models"), chromedp.WaitVisible(chromedp.CSS(`p.traffic`))); err != nil {
			return false, err.Error()
		}
		res, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector("p.prompt-cache") || {}).textContent || ""`))
		if err != nil {
			return false, err.Error()
		}
		cacheLine = res
		return hotRate.MatchString(cacheLine), "the models page's prompt cache line: " + cacheLine
	})
	if !strings.Contains(cacheLine, "bytes from peers: none fetched") || !regexp.MustCompile(`\d+ tokens restored`).MatchString(cacheLine) {
		t.Errorf("the models page's prompt cache line: %q", cacheLine)
	}
	if err := chromedp.Do(ctx, shot("console-models-prompt-cache.png")); err != nil {
		t.Fatal(err)
	}

	// A phone: the page itself never scrolls sideways (wide tables scroll in their box).
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateScale(2)),
		chromedp.Navigate(g.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`svg.bar`)), shot("console-fleet-phone.png")); err != nil {
		t.Fatal(err)
	}
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.documentElement.scrollWidth - document.documentElement.clientWidth`))
	if err != nil {
		t.Fatal(err)
	}
	if overflow > 0 {
		t.Errorf("on a 390 px wide phone the fleet page is %.0f px too wide", overflow)
	}
	if err := chromedp.Do(ctx, chromedp.ResetViewport()); err != nil {
		t.Fatal(err)
	}

	// Page weight and time to render of the fleet page, for docs/benchmarks.md.
	if err := chromedp.Do(ctx, chromedp.Navigate(g.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`svg.bar`))); err != nil {
		t.Fatal(err)
	}
	timing, err := browsertest.NavigationTiming(ctx)
	if err != nil {
		t.Fatal(err)
	}
	weight := 0
	for _, p := range []string{"/ui/", "/ui/static/console.css", "/ui/static/console.js"} {
		code, body := get(g.url+p, g.key)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", p, code)
		}
		weight += len(body)
	}
	t.Logf("fleet page: %d bytes with its stylesheet and script (uncompressed); %s; screenshots in %s",
		weight, timing, art)
}
