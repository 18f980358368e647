package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/wake"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// wakes records the calls of a WakeFunc and answers them with err.
type wakes struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (k *wakes) wake(_ context.Context, ns, name string, at time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, ns+"/"+name+"@"+at.Format(time.RFC3339Nano))
	return k.err
}

func (k *wakes) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.calls)
}

// autoscaledAtZero is deployment a/m with spec.autoscaling at zero replicas, with the
// wake annotation set to woken when it is not zero.
func autoscaledAtZero(woken time.Time) mfv1.ModelDeployment {
	d := deployment("a", "m", "")
	d.Spec.Replicas = ptr.To[int32](0)
	d.Spec.Autoscaling = &mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2}
	if !woken.IsZero() {
		d.Annotations = map[string]string{mfv1.AnnotationWakeRequested: woken.Format(time.RFC3339Nano)}
	}
	return d
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func postAsync(t *testing.T, url string) <-chan answer {
	return sendAsync(t, url, "/v1/chat/completions", chatBody)
}

// sendAsync posts body to url+path with the headers (name, value, …) and delivers
// the answer on the channel.
func sendAsync(t *testing.T, url, path, body string, hdr ...string) <-chan answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, resp.Header, string(b)}
	}()
	return done
}

// TestScaleFromZero: requests for an autoscaled deployment at zero replicas are held,
// not refused; the first of them records one wake for all, and once a replica is
// routable every one of them is served.
func TestScaleFromZero(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) })
	k := &wakes{}
	g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second, Wake: k.wake})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{autoscaledAtZero(time.Time{})}, nil, nil))

	const n = 5
	var done []<-chan answer
	for range n {
		done = append(done, postAsync(t, g.url))
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		held := testutil.ToFloat64(g.metrics.inflight.WithLabelValues("a/m"))
		return held == n, fmt.Sprintf("%v of %d requests held", held, n)
	})
	if c := k.count(); c != 1 {
		t.Errorf("%d wakes recorded for %d held requests, want 1: %v", c, n, k.calls)
	}
	if got := testutil.ToFloat64(g.metrics.wakes.WithLabelValues("a/m", "written")); got != 1 {
		t.Errorf("macfleet_gateway_wakes_total{result=written} = %v, want 1", got)
	}
	for _, ch := range done {
		select {
		case a := <-ch:
			t.Fatalf("answered %d %s before any replica existed", a.code, a.body)
		default:
		}
	}

	// The autoscaler scales to one replica; it becomes Ready.
	d := autoscaledAtZero(time.Now())
	d.Spec.Replicas = ptr.To[int32](1)
	g.SetTable(BuildTable([]mfv1.ModelDeployment{d},
		[]mfv1.ModelReplica{replica("a", "r0", "m", "mac", up.host(), metav1.ConditionTrue)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	for i, ch := range done {
		select {
		case a := <-ch:
			if a.code != 200 || !strings.Contains(a.body, "a/r0") {
				t.Errorf("request %d: %d %s", i, a.code, a.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d was not served once a replica was routable", i)
		}
	}
	// With no request held any more, the gateway forgets the deployment.
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := g.waker.Tracking()
		return n == 0, fmt.Sprintf("still tracking %d deployments", n)
	})
}

func TestScaleFromZeroRenewsWhileHeld(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) })
	k := &wakes{}
	g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second, Wake: k.wake})
	// The renew interval itself is not under test.
	g.waker = wake.New(wake.Config{Write: k.wake, Table: g.Table, Results: g.metrics.wakes, Log: logr.Discard(),
		Renew: 30 * time.Millisecond})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{autoscaledAtZero(time.Time{})}, nil, nil))
	done := postAsync(t, g.url)
	// Renewed while the request waits (e.g. for a replica that is still loading).
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return k.count() >= 3, fmt.Sprintf("%d wakes recorded", k.count())
	})
	g.serveReplicas(up.host())
	if a := <-done; a.code != 200 {
		t.Fatalf("%d %s", a.code, a.body)
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return g.waker.Tracking() == 0, "the renewals go on after the request was served"
	})
}

func TestScaleFromZeroWakeSeen(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) })
	k := &wakes{}
	g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second, Wake: k.wake})
	// Another gateway replica recorded a wake a moment ago: no write.
	g.SetTable(BuildTable([]mfv1.ModelDeployment{autoscaledAtZero(time.Now())}, nil, nil))
	done := postAsync(t, g.url)
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return testutil.ToFloat64(g.metrics.inflight.WithLabelValues("a/m")) == 1, "request not held yet"
	})
	g.serveReplicas(up.host())
	if a := <-done; a.code != 200 {
		t.Fatalf("%d %s", a.code, a.body)
	}
	if c := k.count(); c != 0 {
		t.Errorf("%d wakes written while another gateway's stood: %v", c, k.calls)
	}
}

func TestScaleFromZeroWakeFails(t *testing.T) {
	k := &wakes{err: errors.New(`modeldeployments.macfleet.dev "m" is forbidden`)}
	g := newTestGateway(t, Options{ColdStartTimeout: time.Minute, Wake: k.wake})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{autoscaledAtZero(time.Time{})}, nil, nil))
	start := time.Now()
	resp, body := post(t, g.url, chatBody)
	e := decodeErr(t, body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || e.Error.Code != codeNoReplica ||
		!strings.Contains(e.Error.Message, "could not ask the autoscaler for a replica of deployment a/m") ||
		!strings.Contains(e.Error.Message, "is forbidden") || !strings.Contains(e.Error.Message, "patch on modeldeployments") {
		t.Errorf("%d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("answered after %v: a failed wake must not wait for the cold-start timeout", d)
	}
	if got := testutil.ToFloat64(g.metrics.wakes.WithLabelValues("a/m", "error")); got != 1 {
		t.Errorf("macfleet_gateway_wakes_total{result=error} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(g.metrics.errors.WithLabelValues("a/m", "wake_failed")); got != 1 {
		t.Errorf("macfleet_gateway_errors_total{reason=wake_failed} = %v, want 1", got)
	}
}

// TestScaledToZeroWithoutWake: a deployment at zero that is not autoscaled, or a
// gateway that cannot wake, answers 503 at once, naming the scale to zero.
func TestScaledToZeroWithoutWake(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    mfv1.ModelDeployment
		wake WakeFunc
	}{
		{"not autoscaled", func() mfv1.ModelDeployment {
			d := deployment("a", "m", "")
			d.Spec.Replicas = ptr.To[int32](0)
			return d
		}(), (&wakes{}).wake},
		{"no wake func", autoscaledAtZero(time.Time{}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTestGateway(t, Options{ColdStartTimeout: time.Minute, Wake: tc.wake})
			g.SetTable(BuildTable([]mfv1.ModelDeployment{tc.d}, nil, nil))
			resp, body := post(t, g.url, chatBody)
			if resp.StatusCode != 503 || !strings.Contains(decodeErr(t, body).Error.Message, "scaled to zero") {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
		})
	}
}
