package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// TestStreamOfALostMacIsContinued: a stream whose agent stops answering without
// closing the connection (a stopped process, a frozen Mac) is cut once its Mac is
// lost (its MacNode no longer Ready) and continued on a replica of another Mac; one
// whose replica leaves the table on a Ready Mac (a drain) is not cut.
func TestStreamOfALostMacIsContinued(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lose        bool // mac-a's MacNode becomes not Ready; else r0 leaves the table
		wantText    string
		wantTrailer string
	}{
		{name: "the Mac is lost", lose: true, wantText: "One, two", wantTrailer: "1"},
		{name: "the replica drains", wantText: "One, more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stalled, release := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				if r.Header.Get(runnerapi.HeaderContinue) != "" {
					fmt.Fprint(w, chunkEvent("chatcmpl-cont", roleDelta, "")+chunkEvent("chatcmpl-cont", content(", two"), "")+
						chunkEvent("chatcmpl-cont", `{}`, "stop")+"data: [DONE]\n\n")
					return
				}
				fmt.Fprint(w, chunkEvent("chatcmpl-first", roleDelta, "")+chunkEvent("chatcmpl-first", content("One"), ""))
				_ = rc.Flush()
				close(stalled)
				select { // the agent stops answering
				case <-r.Context().Done():
					return
				case <-release:
				}
				fmt.Fprint(w, chunkEvent("chatcmpl-first", content(", more"), "")+chunkEvent("chatcmpl-first", `{}`, "stop")+
					"data: [DONE]\n\n")
			})
			g := newTestGateway(t, Options{})
			d := []mfv1.ModelDeployment{deployment("a", "m", "")}
			r0, r1 := replica("a", "r0", "m", "mac-a", up.host(), metav1.ConditionTrue), replica("a", "r1", "m", "mac-b", up.host(), metav1.ConditionTrue)
			ready := []mfv1.MacNode{node("mac-a", metav1.ConditionTrue), node("mac-b", metav1.ConditionTrue)}
			g.SetTable(BuildTable(d, []mfv1.ModelReplica{r0}, ready)) // the stream goes to r0
			done := make(chan clientStream)
			go func() {
				resp, err := http.Post(g.url+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`))
				if err != nil {
					t.Error(err)
					close(done)
					return
				}
				defer resp.Body.Close()
				done <- readClientStream(t, resp)
			}()
			<-stalled
			if tc.lose {
				g.SetTable(BuildTable(d, []mfv1.ModelReplica{r0, r1},
					[]mfv1.MacNode{node("mac-a", metav1.ConditionUnknown), node("mac-b", metav1.ConditionTrue)}))
			} else {
				g.SetTable(BuildTable(d, []mfv1.ModelReplica{r1}, ready))
				close(release)
			}
			var got clientStream
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				if tc.lose {
					close(release)
				}
				t.Fatal("the stream still hangs 10 s after the table changed")
			}
			if got.text != tc.wantText || got.dones != 1 || got.errCode != "" || got.trailer != tc.wantTrailer {
				t.Errorf("client read %+v, want %q whole, trailer %q", got, tc.wantText, tc.wantTrailer)
			}
		})
	}
}

// TestRequestOfALostMacIsRetried: a request whose agent stops answering before its
// answer's headers (the connection open, nothing written: a process stopped or a
// Mac frozen between the gateway's choice and the answer) is cut once its Mac is
// lost and tried on a replica of another Mac, as a refused one is; before, it hung
// until the client gave up.
func TestRequestOfALostMacIsRetried(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			stalled, release := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(mfv1.HeaderReplica) == "a/r0" {
					close(stalled)
					select { // the agent stops answering before it writes anything
					case <-r.Context().Done():
					case <-release:
					}
					return
				}
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, chunkEvent("chatcmpl-b", roleDelta, "")+chunkEvent("chatcmpl-b", content("From b"), "")+
						chunkEvent("chatcmpl-b", `{}`, "stop")+"data: [DONE]\n\n")
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"chatcmpl-b","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"From b"},"finish_reason":"stop"}]}`)
			})
			g := newTestGateway(t, Options{})
			t.Cleanup(func() { close(release) }) // before the gateway's: it waits for the stalled request
			d := []mfv1.ModelDeployment{deployment("a", "m", "")}
			r0, r1 := replica("a", "r0", "m", "mac-a", up.host(), metav1.ConditionTrue), replica("a", "r1", "m", "mac-b", up.host(), metav1.ConditionTrue)
			g.SetTable(BuildTable(d, []mfv1.ModelReplica{r0}, []mfv1.MacNode{node("mac-a", metav1.ConditionTrue), node("mac-b", metav1.ConditionTrue)}))
			type answer struct {
				status int
				body   string
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := http.Post(g.url+"/v1/chat/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)))
				if err != nil {
					t.Error(err)
					done <- answer{}
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				done <- answer{resp.StatusCode, string(b)}
			}()
			<-stalled
			g.SetTable(BuildTable(d, []mfv1.ModelReplica{r0, r1},
				[]mfv1.MacNode{node("mac-a", metav1.ConditionUnknown), node("mac-b", metav1.ConditionTrue)}))
			select {
			case got := <-done:
				if got.status != http.StatusOK || !strings.Contains(got.body, "From b") {
					t.Errorf("client got %d %q, want r1's answer", got.status, got.body)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the request still hangs 10 s after its Mac was lost")
			}
		})
	}
}
