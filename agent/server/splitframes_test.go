package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// customOp is a graph record (index 0, then wire.h's mfnd_tensor) of ggml's first
// custom op, MAP_CUSTOM1 (86), with an f32 type.
func customOp() []byte {
	r := make([]byte, 260)
	binary.LittleEndian.PutUint32(r[4+12:], 86)
	return r
}

// TestAttackSplitLinkFrames: the head's Mac, allowed to open its replica's split link
// (real agent API, mutual TLS), sends the worker frames a runner never sends, to make
// it allocate or read what a frame claims: a first frame of 2 GiB, a write claiming
// 1.5 GiB, an allocation beyond the shard's memory, a graph of 2^31 tensors, a graph
// with a custom op (whose op params the worker would call as a function), an unknown
// command, a peer greeting on a runner's link. On main the agent piped each
// to the worker, whose decoder allocated the claimed size. Now the worker Mac's agent
// closes the link at the frame's header: the worker receives the authentication frame
// the agent sends first and the frames before the bad one, not a byte of it; good
// frames pass byte for byte.
func TestAttackSplitLinkFrames(t *testing.T) {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	workerAddr, got := recordingWorker(t)
	secret := bytes.Repeat([]byte{0x5a}, runnerapi.SplitSecretBytes)
	mr := splitOf("team-a", "big-0", "mac-h", "mac-w")
	mr.Spec.Split.Shards[1].Memory = resource.MustParse("1Gi")
	me := pki.Node("mac-w")
	a := startAgent(t, agentOptions{noRunner: true, serverCert: certSource(t, ca, &me),
		splitLink: &splitlink.Handler{Self: "mac-w", Log: logr.Discard(),
			Lookup: func(_ context.Context, ns, name string) (*v1alpha1.ModelReplica, splitlink.Worker) {
				return mr, splitlink.Worker{Addr: workerAddr, Secret: secret}
			}}})
	head := pki.Node("mac-h")
	tlsConf := certSource(t, ca, &head).ClientConfig(me)
	agentAddr := strings.TrimPrefix(a.url, "https://")
	auth := runnerapi.SplitAuthFrame(secret)
	u64s := func(vs ...uint64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	graph := func(nTensors, nNodes, nChanged uint32) []byte {
		var b []byte
		for _, v := range []uint32{nTensors, nNodes, nChanged, 0, 0, 0} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		return append(b, make([]byte, 8)...)
	}
	header := func(cmd byte, size uint32) []byte { return append(binary.LittleEndian.AppendUint32(nil, size), cmd) }
	for _, tc := range []struct {
		name      string
		good, bad []byte
	}{
		{"good frames pass", append(helloFrame(), setFrame(1000)...), nil},
		{"a first frame of 2 GiB", nil, header(1, 1<<31)},
		{"a write claiming 1.5 GiB", helloFrame(), append(header(5, 16+3<<29), u64s(4096, 3<<29)...)},
		{"an allocation beyond the shard's memory", helloFrame(), frame(2, u64s(8<<30))},
		{"a graph of 2^31 tensors", helloFrame(), append(header(10, 32+260), graph(1<<31, 1, 1)...)},
		{"a graph whose tensor is a custom op (a function pointer in its op params)", helloFrame(),
			append(append(header(10, 32+260), graph(1, 0, 1)...), customOp()...)},
		{"an unknown command", helloFrame(), frame(99, nil)},
		{"a peer greeting on a runner's link", helloFrame(), frame(runnerapi.SplitPeerHello, make([]byte, 16))},
	} {
		c, err := splitlink.Dial(t.Context(), agentAddr, tlsConf, "team-a", "big-0")
		if err != nil {
			t.Fatalf("%s: the head's Mac opening its link: %v", tc.name, err)
		}
		if _, err := c.Write(append(append([]byte(nil), tc.good...), tc.bad...)); err != nil {
			t.Fatal(err)
		}
		if tc.bad != nil {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Errorf("%s: the link stayed open (%v), want it closed", tc.name, err)
			}
		}
		c.Close()
		var b []byte
		select {
		case b = <-got:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the worker saw no connection end", tc.name)
		}
		if want := append(append([]byte(nil), auth...), tc.good...); !bytes.Equal(b, want) {
			t.Errorf("%s: the worker received %d bytes, want the authentication frame and the %d good bytes only",
				tc.name, len(b), len(tc.good))
		}
	}
}
