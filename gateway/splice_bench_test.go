package gateway

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// BenchmarkSpliceReader measures what reading a Chat Completions stream event by event
// (to be able to continue it) costs against copying its bytes, per event, on a
// 1000-token stream of one-token chunks.
func BenchmarkSpliceReader(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(chunkEvent("chatcmpl-bench", roleDelta, ""))
	for range 1000 {
		sb.WriteString(chunkEvent("chatcmpl-bench", content(" word"), ""))
	}
	sb.WriteString(chunkEvent("chatcmpl-bench", `{}`, "stop"))
	sb.WriteString("data: [DONE]\n\n")
	stream := []byte(sb.String())
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
	b.Run("splice", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		for b.Loop() {
			r := newSpliceReader(io.NopCloser(bytes.NewReader(stream)), &spliced{}, false)
			for {
				if _, err := r.Read(buf); err != nil {
					if err != io.EOF {
						b.Fatal(err)
					}
					break
				}
			}
		}
	})
}
