package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/pki"
)

// echoWorker stands in for `macfleet-runner worker` on the worker Mac's loopback: it
// answers every worker protocol frame it reads with the same frame. conns receives
// each connection it accepted.
func echoWorker(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
			go func() {
				defer c.Close()
				for {
					head := make([]byte, 5)
					if _, err := io.ReadFull(c, head); err != nil {
						return
					}
					payload := make([]byte, binary.LittleEndian.Uint32(head))
					if _, err := io.ReadFull(c, payload); err != nil {
						return
					}
					if _, err := c.Write(append(head, payload...)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// helloFrame is a runner's greeting (HELLO and a 56-byte mfnd_hello; the content is
// the worker's to check), setFrame a SET of n bytes (a 16-byte header, then them).
func helloFrame() []byte { return frame(1, make([]byte, 56)) }

func setFrame(n int) []byte {
	h := binary.LittleEndian.AppendUint64(make([]byte, 8), uint64(n))
	return frame(5, append(h, strings.Repeat("x", n)...))
}

func splitOf(ns, name, head string, workers ...string) *v1alpha1.ModelReplica {
	mr := &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	mr.Spec.NodeName = head
	mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{{Node: head}}}
	for _, w := range workers {
		mr.Spec.Split.Shards = append(mr.Spec.Split.Shards, v1alpha1.ReplicaShard{Node: w})
	}
	return mr
}

// TestAttackSplitLinkByAnotherMac: through the real agent API over mutual TLS, the Mac of a split
// replica's head reaches its worker shard's worker on another Mac's loopback, byte for
// byte, via a loopback forwarder for its runner; a worker lost closes the runner's
// connection at once. Another Mac's certificate (even one holding a shard of another
// replica there), the worker Mac's own, a gateway's, and a tenant's token cannot open
// the link.
func TestAttackSplitLinkByAnotherMac(t *testing.T) {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	workerAddr, workerConns := echoWorker(t)
	replicas := map[string]*v1alpha1.ModelReplica{
		"team-a/big-0":   splitOf("team-a", "big-0", "mac-h", "mac-w"),
		"team-b/other-0": splitOf("team-b", "other-0", "mac-x", "mac-w"),
		"team-a/far-0":   splitOf("team-a", "far-0", "mac-h", "mac-z"),
	}
	const tenantToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZW5hbnQifQ.c2ln"
	me := pki.Node("mac-w")
	a := startAgent(t, agentOptions{noRunner: true, serverCert: certSource(t, ca, &me),
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:team-a:app"}, nil
		},
		splitLink: &splitlink.Handler{Self: "mac-w", Log: logr.Discard(),
			Lookup: func(_ context.Context, ns, name string) (*v1alpha1.ModelReplica, splitlink.Worker) {
				return replicas[ns+"/"+name], splitlink.Worker{Addr: workerAddr}
			}}})
	agentAddr := strings.TrimPrefix(a.url, "https://")
	dialAs := func(id pki.Identity, ns, name string) (net.Conn, error) {
		return splitlink.Dial(t.Context(), agentAddr, certSource(t, ca, &id).ClientConfig(me), ns, name)
	}

	// The head's agent forwards its runner's connections.
	fwd, err := splitlink.Forward(func(ctx context.Context) (net.Conn, error) {
		return dialAs(pki.Node("mac-h"), "team-a", "big-0")
	}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	if host, _, _ := net.SplitHostPort(fwd.Addr()); host != "127.0.0.1" {
		t.Errorf("the forwarder listens on %s, want loopback only", fwd.Addr())
	}
	runner, err := net.Dial("tcp", fwd.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()
	rd := bufio.NewReader(runner)
	for _, msg := range [][]byte{helloFrame(), setFrame(100_000)} {
		if _, err := runner.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = runner.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(rd, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("through the link: %q (%v), want the worker's echo of %d bytes", trim(string(got)), err, len(msg))
		}
	}

	// The worker dies: the runner's connection ends within a second, not at a timeout.
	var wc net.Conn
	select {
	case wc = <-workerConns:
	case <-time.After(5 * time.Second):
		t.Fatal("the worker saw no connection")
	}
	start := time.Now()
	wc.Close()
	_ = runner.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rd.ReadByte(); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Errorf("the runner's connection after the worker died: %v, want it closed", err)
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("the runner learned the worker died after %v, want under 1s", d)
	}

	// Attacks: only the head's Mac, with its certificate, opens the link.
	for _, tc := range []struct {
		name     string
		id       pki.Identity
		ns, repl string
		want     string
	}{
		{"another Mac (the head of another replica with a shard here)", pki.Node("mac-x"), "team-a", "big-0", "only the Mac of replica team-a/big-0's head, mac-h, may open its split link, not mac-x"},
		{"the worker Mac itself", pki.Node("mac-w"), "team-a", "big-0", "not mac-w"},
		{"the head, for a replica with no shard here", pki.Node("mac-h"), "team-a", "far-0", "replica team-a/far-0 holds no worker shard on mac-w"},
		{"the head, for an unknown replica", pki.Node("mac-h"), "team-a", "nope", "no replica of that name holds a worker shard on mac-w"},
		{"a gateway", pki.Gateway("gw"), "team-a", "big-0", "the certificate of macfleet://gateway/gw may not open a split link"},
		{"the manager", pki.Manager("macfleet-manager"), "team-a", "big-0", "may not open a split link"},
		{"a metrics scraper", pki.Metrics("prometheus"), "team-a", "big-0", "may only scrape"},
	} {
		c, err := dialAs(tc.id, tc.ns, tc.repl)
		if err == nil {
			c.Close()
			t.Errorf("%s: opened the link, want refused", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a 403 saying %q", tc.name, err, tc.want)
		}
	}
	// mac-x holds the head of team-b/other-0, whose worker is here too: its own link works.
	if c, err := dialAs(pki.Node("mac-x"), "team-b", "other-0"); err != nil {
		t.Errorf("mac-x opening the link of the replica it heads: %v", err)
	} else {
		c.Close()
	}

	// No certificate: a tenant's ServiceAccount token reaches only /v1/.
	tr := &http.Transport{TLSClientConfig: certSource(t, ca, nil).ClientConfig(me)}
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, a.url+splitlink.Path("team-a", "big-0"), nil)
	req.Header.Set("Authorization", "Bearer "+tenantToken)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", splitlink.Protocol)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "reaches only the OpenAI API") {
		t.Errorf("a tenant's token: %s %s, want 401", resp.Status, body)
	}
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
