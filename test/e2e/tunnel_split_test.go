package e2e

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestOutboundMacSplitReplica: a deployment with maxMacsPerReplica 2 whose replica fits
// neither of two Macs that dial out (their advertised addresses answer nothing) is
// placed across both, behind an in-process gateway with --tunnel-listen. The head's
// Mac opens its link to the worker's through its own tunnel, which the gateway joins
// to the worker's tunnel for the split replica's link only (the TLS inside is the two
// Macs'), and the split replica answers through the gateway, streamed and not, token
// for token as the same model in one process on a Mac the gateway reaches.
func TestOutboundMacSplitReplica(t *testing.T) {
	if err := splitModel(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log, relayed := countingLog(t, "Relaying a split link")
	url, _ := inProcessGateway(t, gateway.Config{TunnelListener: ln}, log)

	nsWhole, ns := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	const pool = "outbound"
	create(t, splitDeployment(nsWhole, "whole", 1, ""))
	create(t, splitDeployment(ns, "split", 2, pool))
	lm := layerMemoryOf(t, ns, "split")
	names := addSplitPoolWith(t, pool, func() []string { return outboundArgs(t, ln.Addr().String(), false) },
		poolCeilings(t, lm, gangLayers(int64(lm.Layers), 2)...)...)
	t.Cleanup(func() { removeDeployment(t, ns, "split") }) // before the pool's Macs go
	for _, name := range names {
		if err := fleet.WaitNodeReady(t.Context(), name); err != nil {
			t.Fatal(err)
		}
	}
	checkGang(t, ns, "split", names)
	waitReady(t, nsWhole, "whole", 1, 3*time.Minute)

	split, whole := ns+"/split", nsWhole+"/whole"
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChat(t.Context(), url, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, split))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", split, code, text, err)
	})
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	for _, p := range splitPrompts[:2] {
		want := greedy(t, c, whole, p, false)
		for _, stream := range []bool{false, true} {
			if got := greedy(t, c, split, p, stream); got != want || want == "" {
				t.Errorf("prompt %q (streamed %v): split across the Macs that dial out answered %q, one process %q", p, stream, got, want)
			}
		}
	}
	if relayed.Load() == 0 {
		t.Errorf("the gateway relayed no split link: the head's Mac did not reach the worker's through the tunnels")
	}
	t.Logf("the gateway relayed %d split links", relayed.Load())
}
