package tunnel

import (
	"context"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/internal/pki"
)

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   []string
		err    string
	}{
		{answer: "ok\n"},
		{answer: "ok mac-a mac-b\n", want: []string{"mac-a", "mac-b"}},
		{answer: "refused: only a gateway replica reads the Macs' tunnels\n", err: "only a gateway replica"},
		{answer: "okmac-a\n", err: "unexpected answer"},
		{answer: "none\n", err: "unexpected answer"},
	} {
		got, err := ParseList(tc.answer)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ParseList(%q) = %q, %v; want %q, %q", tc.answer, got, err, tc.want, tc.err)
		}
	}
}

func TestPlaceMacs(t *testing.T) {
	addrs := []string{"10.0.0.1:8444", "10.0.0.2:8444"}
	got := PlaceMacs(addrs, [][]string{{"mac-a", "mac-b"}, {"mac-c", "mac-b"}})
	want := map[string]string{"mac-a": addrs[0], "mac-b": addrs[1], "mac-c": addrs[1]}
	if !maps.Equal(got, want) {
		t.Errorf("PlaceMacs = %v, want %v (a Mac two replicas list goes to the later)", got, want)
	}
	if got := PlaceMacs(addrs, [][]string{nil, nil}); len(got) != 0 {
		t.Errorf("PlaceMacs of empty lists = %v", got)
	}
}

func TestCheckReplicaAddrs(t *testing.T) {
	if err := CheckReplicaAddrs([]string{"10.0.0.1:8444", "macfleet-gateway-tunnel-replicas.macfleet-system.svc:8444", "[::1]:1"}); err != nil {
		t.Errorf("good addresses: %v", err)
	}
	for _, bad := range []string{"macfleet-gateway-tunnel-replicas", ":8444", "gw:http", "gw:0", "gw:70000"} {
		if err := CheckReplicaAddrs([]string{"10.0.0.1:8444", bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("CheckReplicaAddrs(%q) = %v; want an error naming it", bad, err)
		}
	}
}

func TestParseGrant(t *testing.T) {
	target, source, until, err := ParseGrant("mac-b mac-a 1700000000123")
	if err != nil || target != "mac-b" || source != "mac-a" || !until.Equal(time.UnixMilli(1700000000123)) {
		t.Errorf("ParseGrant = %q, %q, %v, %v", target, source, until, err)
	}
	for _, bad := range []string{"mac-b mac-a", "mac-b mac-a soon", "mac-b mac-a -5", "mac-b mac-a 1 2"} {
		if _, _, _, err := ParseGrant(bad); err == nil {
			t.Errorf("ParseGrant(%q) took it", bad)
		}
	}
}

func TestAdmitReplica(t *testing.T) {
	for _, tc := range []struct {
		id      pki.Identity
		hasCert bool
		err     string
	}{
		{id: pki.Gateway("gw-2"), hasCert: true},
		{id: pki.Manager("macfleet-manager"), hasCert: true, err: "only a gateway replica"},
		{id: pki.Node("mac-a"), hasCert: true, err: "only a gateway replica"},
		{err: "no client certificate"},
	} {
		err := AdmitReplica(tc.id, tc.hasCert)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("AdmitReplica(%s, %v) = %v; want %q", tc.id, tc.hasCert, err, tc.err)
		}
	}
}

// twoReplicas are two gateway replicas that read each other's lists (and their own):
// mac-a holds its tunnel to the first, mac-b to the second.
func twoReplicas(t testing.TB) (fc *fleetCerts, gw1, gw2 *Sessions, addr1, addr2 string, b *Agent) {
	t.Helper()
	fc = newFleetCerts(t)
	gw2Certs := source(t, fc.ca, pki.Gateway("gw-2"))
	gw1, addr1 = startGateway(t, fc.gateway)
	gw2, addr2 = startGateway(t, gw2Certs)
	for _, g := range []struct {
		s     *Sessions
		certs *pki.Source
	}{{gw1, fc.gateway}, {gw2, gw2Certs}} {
		g.s.Replicas = &Replicas{Addrs: []string{addr1, addr2}, Certificates: g.certs, Every: 20 * time.Millisecond,
			Log: testr.NewWithInterface(t, testr.Options{})}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { g.s.Replicas.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	startAgent(t, addr1, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	b = startAgent(t, addr2, "mac-b", source(t, fc.ca, pki.Node("mac-b")), whoami("mac-b"))
	waitNodes(t, gw1, "mac-a")
	waitNodes(t, gw2, "mac-b")
	waitSession(t, b)
	deadline := time.Now().Add(10 * time.Second)
	for !gw1.Reaches("mac-b") || !gw2.Reaches("mac-a") {
		if time.Now().After(deadline) {
			t.Fatal("the replicas did not read each other's lists")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fc, gw1, gw2, addr1, addr2, b
}

// TestReplicasReachEachOthersMacs: with two gateway replicas, a Mac that dials out to
// one is reached from the other — a request (the agent sees the second replica's
// certificate: the TLS is theirs), the manager's read through either replica, a split
// link between Macs whose tunnels are on different replicas — and a replica's relay
// to a Mac it does not hold goes no further (no loops, no third replica).
func TestReplicasReachEachOthersMacs(t *testing.T) {
	fc, gw1, gw2, addr1, addr2, b := twoReplicas(t)

	if got, err := get(t.Context(), client(gw2, source(t, fc.ca, pki.Gateway("gw-2"))), "mac-a", "/"); err != nil || got != "mac-a for macfleet://gateway/gw-2" {
		t.Errorf("gw-2 asking mac-a, whose tunnel gw holds: %q, %v; want mac-a's agent seeing gw-2's certificate", got, err)
	}
	if got, err := get(t.Context(), client(gw1, fc.gateway), "mac-b", "/"); err != nil || got != "mac-b for macfleet://gateway/gw" {
		t.Errorf("gw asking mac-b, whose tunnel gw-2 holds: %q, %v", got, err)
	}
	manager := source(t, fc.ca, pki.Manager("macfleet-manager"))
	for _, addr := range []string{addr1, addr2} {
		for _, node := range []string{"mac-a", "mac-b"} {
			got, err := get(t.Context(), managerClient(&Relay{Gateway: addr, Certificates: manager}), node, "/api/status")
			if want := node + " for macfleet://manager/macfleet-manager"; err != nil || got != want {
				t.Errorf("the manager reading %s through the replica at %s: %q, %v; want %q", node, addr, got, err, want)
			}
		}
	}
	// A replica's own relay line reaches only the tunnels it holds.
	r := &Relay{Gateway: addr2, Certificates: fc.gateway}
	if _, err := r.Dial(t.Context(), "mac-a"); !errors.Is(err, ErrNoSession) {
		t.Errorf("gw asking gw-2 for mac-a, which gw-2 does not hold: %v; want none (one hop at most)", err)
	}
	if c, err := r.Dial(t.Context(), "mac-b"); err != nil {
		t.Errorf("gw asking gw-2 for mac-b: %v", err)
	} else {
		c.Close()
	}

	// A split link from mac-b (its tunnel on gw-2) to mac-a (on gw).
	through := func(ctx context.Context, network, addr string) (net.Conn, error) { return b.DialPeer(ctx, "mac-a") }
	var re *RefusedError
	if _, err := b.DialPeer(t.Context(), "mac-a"); !errors.As(err, &re) {
		t.Errorf("mac-b asking for mac-a with no link or grant: %v; want the refusal", err)
	}
	gw2.SetLinks(map[Link]bool{{From: "mac-b", To: "mac-a"}: true})
	if got, err := peerGet(t, source(t, fc.ca, pki.Node("mac-b")), through, "mac-a", "/split"); err != nil || got != "mac-a for macfleet://node/mac-b" {
		t.Errorf("mac-b over its split link to mac-a through two replicas: %q, %v", got, err)
	}

	// A peer fetch that gw signed for mac-b (its tunnel on gw-2) from mac-a: gw gives
	// gw-2 the grant, and gw-2 joins mac-b's stream through gw to mac-a.
	gw2.SetLinks(nil)
	if err := gw1.Grant(t.Context(), "mac-b", "mac-a", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("gw granting mac-b's fetch from mac-a through gw-2: %v", err)
	}
	if got, err := peerGet(t, source(t, fc.ca, pki.Node("mac-b")), through, "mac-a", "/state"); err != nil || got != "mac-a for macfleet://node/mac-b" {
		t.Errorf("mac-b fetching from mac-a on a grant of the other replica: %q, %v", got, err)
	}
}

// TestAttackReplicaListAsAMac: a Mac's certificate (or the manager's) asks a replica
// which Macs dial out to it, or gives the replica holding its tunnel the grant to
// fetch from another Mac as a replica would: refused, and no relay follows.
func TestAttackReplicaListAsAMac(t *testing.T) {
	fc, _, _, addr1, addr2, b := twoReplicas(t)
	for _, id := range []pki.Identity{pki.Node("mac-b"), pki.Manager("macfleet-manager")} {
		r := &Replicas{Certificates: source(t, fc.ca, id), where: map[string]string{"mac-b": addr2}}
		nodes, err := r.list(t.Context(), addr1)
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(re.Reason, "only a gateway replica") {
			t.Errorf("%s reading the list: %q, %v; want the refusal", id, nodes, err)
		}
		err = r.Grant(t.Context(), "mac-b", "mac-a", time.Now().Add(time.Minute))
		if !errors.As(err, &re) || !strings.Contains(re.Reason, "only a gateway replica") {
			t.Errorf("%s granting mac-b's fetch from mac-a: %v; want the refusal", id, err)
		}
	}
	if _, err := b.DialPeer(t.Context(), "mac-a"); !errors.As(err, new(*RefusedError)) {
		t.Errorf("mac-b asking for mac-a after the forged grants: %v; want the refusal", err)
	}
}

// BenchmarkTunnelThroughAnotherReplica: the p50 latency of a short request over a
// kept-alive connection from one gateway replica to a Mac whose tunnel it holds and to
// one whose tunnel the other replica holds, and their ratio.
func BenchmarkTunnelThroughAnotherReplica(b *testing.B) {
	fc, gw1, _, _, _, _ := twoReplicas(b)
	c := client(gw1, fc.gateway)
	ask := func(node string) time.Duration {
		start := time.Now()
		if _, err := get(context.Background(), c, node, "/"); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	ask("mac-a") // the connections' handshakes are not measured
	ask("mac-b")
	var own, other []time.Duration
	b.ResetTimer()
	for range b.N {
		own = append(own, ask("mac-a"))
		other = append(other, ask("mac-b"))
	}
	o, r := p50(own), p50(other)
	b.ReportMetric(float64(o.Microseconds()), "own-tunnel-p50-µs")
	b.ReportMetric(float64(r.Microseconds()), "other-replica-p50-µs")
	b.ReportMetric(float64(r)/float64(o), "other/own-p50")
}
