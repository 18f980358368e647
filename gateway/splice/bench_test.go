package splice

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// BenchmarkSpliceReader measures what reading a Chat Completions stream event by event
// (to be able to continue it) costs against copying its bytes, per event, on a
// 1000-token stream of one-token chunks; splice-counted reads the stream with the
// runner's count line before each event and its prompt's line before the first
// (runnerapi.HeaderTokenCounts), as the gateway gets it.
func BenchmarkSpliceReader(b *testing.B) {
	events := func(counted bool) []byte {
		var sb strings.Builder
		if counted {
			sb.WriteString(promptLine)
		}
		sb.WriteString(chunkEvent("chatcmpl-bench", roleDelta, ""))
		for i := range 1000 {
			if counted {
				fmt.Fprintf(&sb, "%s 0 %d\n", runnerapi.TokenCountComment, i+1)
			}
			sb.WriteString(chunkEvent("chatcmpl-bench", content(" word"), ""))
		}
		sb.WriteString(chunkEvent("chatcmpl-bench", `{}`, "stop"))
		sb.WriteString("data: [DONE]\n\n")
		return []byte(sb.String())
	}
	stream := events(false)
	buf := make([]byte, 32<<10)
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		for b.Loop() {
			r := bytes.NewReader(stream)
			for {
				if _, err := r.Read(buf); err != nil {
					break
				}
			}
		}
	})
	splice := func(stream []byte) func(b *testing.B) {
		return func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				r := NewReader(io.NopCloser(bytes.NewReader(stream)), &Stream{}, false)
				for {
					if _, err := r.Read(buf); err != nil {
						if err != io.EOF {
							b.Fatal(err)
						}
						break
					}
				}
			}
		}
	}
	b.Run("splice", splice(stream))
	b.Run("splice-counted", splice(events(true)))
}
