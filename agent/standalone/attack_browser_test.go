package standalone_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/browsertest"
)

// chatRequests is the sum of the agent's macfleet_agent_requests_total for model m.
func chatRequests(t *testing.T, addr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "macfleet_agent_requests_total{") && strings.Contains(l, `model="m"`) {
			v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			sum += v
		}
	}
	return sum
}

// TestAttackBrowserPageCallsServe: a web page open in the developer's headless
// Chromium (another site: localhost, where serve is 127.0.0.1) spends the model with a
// no-cors fetch to /v1/chat/completions and submits a hidden form to unload it; the
// attacker must now get neither: no request reaches the model and it stays loaded.
func TestAttackBrowserPageCallsServe(t *testing.T) {
	bin := browsertest.Chromium(t)
	s := serveMac(t, httpserver.Limits{})
	target := "http://" + s.addr
	page := fmt.Sprintf(`<!doctype html><title>cute cats</title>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="%[1]s/api/models/m/unload" target="sink" enctype="text/plain">
<input name='{"x":"' value='"}'></form>
<script>
fetch(%[2]q, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
  body: JSON.stringify({model: "m", max_tokens: 8, messages: [{role: "user", content: "hi"}]})})
  .finally(() => {
    document.querySelector("iframe").addEventListener("load", () => { document.body.dataset.done = "1"; });
    document.getElementById("f").submit();
  });
</script>`, target, target+"/v1/chat/completions")
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another site than serve's 127.0.0.1

	ctx := browsertest.New(t, bin, 2*time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(evilURL+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.dataset.done === "1"`)); err != nil {
		t.Fatalf("the page did not finish its requests: %v", err)
	}
	if n := chatRequests(t, s.addr); n != 0 {
		t.Errorf("%v chat requests of the page reached the model; want none", n)
	}
	if st := s.state(t); st != enginepool.StateReady {
		t.Errorf("the model is %s after the page's form; want it still %s", st, enginepool.StateReady)
	}
	// The metric counts: a program's request is served and counted.
	resp, err := http.Post(target+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := chatRequests(t, s.addr); resp.StatusCode != http.StatusOK || n != 1 {
		t.Errorf("a program's chat: %d, counted %v; want 200, counted once", resp.StatusCode, n)
	}
}
