// Package browsertest starts headless Chromium for tests that drive a page (the
// console's), with chromedp: where the browser is, a fresh profile per test,
// screenshots into the test's artifact directory.
package browsertest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium is the browser to drive: $MACFLEET_CHROMIUM, else the Debian package's.
// Without one the test skips, except in CI, where .ci/run installs it and a missing
// browser is a failure.
func Chromium(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("MACFLEET_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("CI is set but there is no chromium: install the Debian package chromium (.ci/run does) or set MACFLEET_CHROMIUM")
	}
	t.Skip("no chromium: install the Debian package chromium (or set MACFLEET_CHROMIUM) to run the console's browser tests")
	return ""
}

// ArtifactDir keeps a test's screenshots: $ARTIFACTS/<test name> when ARTIFACTS is
// set, else the test's temporary directory.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("ARTIFACTS")
	if d == "" {
		return t.TempDir()
	}
	d = filepath.Join(d, filepath.FromSlash(t.Name()))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// New starts headless Chromium (bin) with a fresh profile and returns a tab's context,
// closed when the test ends or after timeout.
func New(t testing.TB, bin string, timeout time.Duration) context.Context {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	return ctx
}

// Screenshot writes the whole page as a PNG to dir/name.
func Screenshot(dir, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100 is a PNG
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), png, 0o644)
	})
}

// Playground sends the page's default message to model on the console's playground page
// at url, waits for the stream to end and screenshots the page into dir/shot. It fails
// the test unless an answer streamed and the status says it is done.
func Playground(t testing.TB, ctx context.Context, url, model, dir, shot string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`#pg-model`)),
		chromedp.SetValue(chromedp.CSS(`#pg-model`), model),
		chromedp.SetValue(chromedp.CSS(`#pg-max`), "8"),
		chromedp.Click(chromedp.CSS(`#playground button`)),
		chromedp.WaitVisible(chromedp.CSS(`#pg-answer[data-done]`)),
		Screenshot(dir, shot),
	); err != nil {
		t.Fatalf("playground: %v", err)
	}
	var out [2]string
	for i, sel := range []chromedp.CSS{`#pg-answer`, `#pg-status`} {
		v, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("playground %s: %v", sel, err)
		}
		out[i] = v
	}
	if out[0] == "" || !strings.HasPrefix(out[1], "Done:") {
		t.Errorf("playground: answer %q, status %q", out[0], out[1])
	}
}

// PlaygroundModels are the models the current playground page offers (its select's
// values), sorted.
func PlaygroundModels(ctx context.Context) ([]string, error) {
	options, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#pg-model option")].map(o => o.value)`))
	slices.Sort(options)
	return options, err
}

// NavigationTiming describes how the current page loaded, from the browser's own
// navigation timing: time to the first byte, to DOM interactive and to
// DOMContentLoaded.
func NavigationTiming(ctx context.Context) (string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const n = performance.getEntriesByType("navigation")[0];
		return "first byte " + Math.round(n.responseStart - n.requestStart) + " ms, DOM interactive " +
			Math.round(n.domInteractive - n.startTime) + " ms, DOMContentLoaded " + Math.round(n.domContentLoadedEventEnd - n.startTime) + " ms" })()`))
}
