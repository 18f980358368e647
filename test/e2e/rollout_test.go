package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// stoppableGateway is an in-process gateway with its probes, which the test stops the
// way a rollout does (the signal ends its context).
type stoppableGateway struct {
	url, probes string
	stop        context.CancelFunc
	done        chan error
}

func startStoppableGateway(t *testing.T) *stoppableGateway {
	t.Helper()
	var lns [2]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	cfg := gateway.Config{RestConfig: fleet.Env.Config, Listener: lns[0], ProbeListener: lns[1], MetricsAddr: "0",
		AgentCertSecret: v1alpha1.SystemNamespace + "/" + v1alpha1.GatewayTLSSecret, Registerer: prometheus.NewRegistry(), DisableConsole: true}
	ctrlLogOnce.Do(func() { ctrl.SetLogger(logr.Discard()) })
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), testr.New(t)))
	g := &stoppableGateway{url: "http://" + lns[0].Addr().String(), probes: "http://" + lns[1].Addr().String(),
		stop: cancel, done: make(chan error, 1)}
	go func() { g.done <- gateway.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-g.done:
		case <-time.After(time.Minute):
			t.Error("the gateway did not stop")
		}
	})
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		code := g.readyz()
		return code == http.StatusOK, fmt.Sprintf("the gateway's /readyz answers %d", code)
	})
	return g
}

// readyz is the gateway's /readyz status (0 when it does not answer).
func (g *stoppableGateway) readyz() int {
	resp, err := http.Get(g.probes + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// stream is one streamed chat completion through a gateway, read to its end.
type stream struct {
	events int
	last   string // the last data line
	err    error
}

// startStream sends a long streamed chat to base and returns once its first event
// arrived; the rest is read in the background into the result channel.
func startStream(t *testing.T, base, model string) <-chan stream {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":6000,"temperature":0,"messages":[{"role":"user","content":"Tell a long story"}]}`, model)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// Closed first when the test ends early, so the gateway's drain does not wait for it.
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if resp.StatusCode != http.StatusOK || err != nil || !strings.HasPrefix(first, "data: {") {
		resp.Body.Close()
		t.Fatalf("stream: %d %q %v", resp.StatusCode, first, err)
	}
	out := make(chan stream, 1)
	go func() {
		defer resp.Body.Close()
		s := stream{events: 1}
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") {
				s.events++
				s.last = strings.TrimSpace(line)
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.err = err
				}
				out <- s
				return
			}
		}
	}()
	return out
}

// TestGatewayRolloutBreaksNoStream: streams run through one gateway replica while a
// second one serves beside it; the first is stopped as a rollout stops it. Its /readyz
// fails at once and it takes no new connection (new requests go to the second), yet
// every stream it carried runs to its end.
func TestGatewayRolloutBreaksNoStream(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "roll", 1, func(md *v1alpha1.ModelDeployment) {
		// Two slots more than the streams: the request to the other gateway is served at once.
		md.Spec.Engine.ContextLength, md.Spec.Engine.Parallel = 8192, 6
	}))
	waitReady(t, ns, "roll", 1, 3*time.Minute)
	model := ns + "/roll"
	old, next := startStoppableGateway(t), startStoppableGateway(t)
	ask := func(base string) error {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(fmt.Sprintf(
			`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model)))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	for _, g := range []*stoppableGateway{old, next} {
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			err := ask(g.url)
			return err == nil, fmt.Sprintf("gateway %s does not serve %s yet: %v", g.url, model, err)
		})
	}

	const n = 4
	var streams []<-chan stream
	for range n {
		streams = append(streams, startStream(t, old.url, model))
	}
	stopped := time.Now()
	old.stop() // SIGTERM
	testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
		code := old.readyz()
		return code == http.StatusServiceUnavailable, fmt.Sprintf("the stopped gateway's /readyz answers %d, want 503", code)
	})
	testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
		err := ask(old.url)
		return errors.Is(err, syscall.ECONNREFUSED), fmt.Sprintf("a new request to the stopped gateway: %v, want its connection refused", err)
	})
	if err := ask(next.url); err != nil {
		t.Errorf("a new request to the other gateway: %v", err)
	}
	inFlight := 0
	for _, ch := range streams {
		if len(ch) == 0 {
			inFlight++
		}
	}
	if inFlight == 0 {
		t.Fatal("every stream ended before the gateway stopped taking connections: too short to test the drain")
	}
	t.Logf("%d of %d streams in flight %s after the stop, with /readyz failing and new connections refused",
		inFlight, n, time.Since(stopped).Round(time.Millisecond))
	var wg sync.WaitGroup
	results := make([]stream, n)
	for i, ch := range streams {
		wg.Go(func() { results[i] = <-ch })
	}
	wg.Wait()
	t.Logf("the streams ended %s after the stop", time.Since(stopped).Round(time.Millisecond))
	for i, s := range results {
		if s.err != nil || s.last != "data: [DONE]" || s.events < 10 {
			t.Errorf("stream %d broke: %d events, last %q, %v", i, s.events, s.last, s.err)
		}
	}
	select {
	case err := <-old.done:
		old.done <- err // for the cleanup
		if err != nil {
			t.Errorf("the stopped gateway: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("the stopped gateway did not return once its streams ended")
	}
}

// TestGatewayRolloutKeepsColdStartHolds: a request a gateway holds for a cold start
// (an autoscaled deployment at zero) when the gateway is stopped is answered once the
// replica comes up: the routing table keeps up while the gateway drains.
func TestGatewayRolloutKeepsColdStartHolds(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	atZero(t, ns, "cold")
	t.Cleanup(func() { removeDeployment(t, ns, "cold") })
	old := startStoppableGateway(t)
	answered := make(chan error, 1)
	go func() {
		c := openai.NewClient(option.WithBaseURL(old.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
		_, err := chat(context.Background(), c, ns+"/cold", true)
		answered <- err
	}()
	// The gateway holds the request and wakes the deployment.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "cold"}, &md); err != nil {
			return false, err.Error()
		}
		return md.Annotations[v1alpha1.AnnotationWakeRequested] != "", "the gateway has not woken the deployment yet"
	})
	if len(answered) > 0 {
		t.Fatalf("answered before the stop (%v): no hold to test", <-answered)
	}
	stopped := time.Now()
	old.stop() // SIGTERM while the request is held
	select {
	case err := <-answered:
		if err != nil {
			t.Errorf("the request held at the stop: %v", err)
		}
		t.Logf("the held request was answered %s after the stop", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(3 * time.Minute):
		t.Fatal("the request held at the stop was not answered within 3 minutes")
	}
}
