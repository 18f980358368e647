package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/gateway/prefixdigest"
)

// agentBody is a coding agent's turn: a long system prompt, tool definitions and a
// conversation of turns messages, about kb KiB of JSON.
func agentBody(systemBytes, tools, turns int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", strings.Repeat("You are a careful coding agent. ", systemBytes/32)}}
	for i := range turns {
		msgs = append(msgs, msg{"user", fmt.Sprintf("Step %d: read the file and fix the failing test.", i)},
			msg{"assistant", strings.Repeat(fmt.Sprintf("I changed line %d. ", i), 20)})
	}
	var ts []map[string]any
	for i := range tools {
		ts = append(ts, map[string]any{"type": "function", "function": map[string]any{
			"name": fmt.Sprintf("tool_%d", i), "description": strings.Repeat("Does one thing well. ", 10),
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]string{"type": "string"}}},
		}})
	}
	b, _ := json.Marshal(map[string]any{"model": "ns/coder", "stream": true, "messages": msgs, "tools": ts})
	return b
}

// BenchmarkPrefixDigests is the gateway's per-request cost of prefix-cache routing (the
// prefix digests of a coding agent's turn) against the head parse every request already
// pays, in the same run: compare digests/op with head/op.
func BenchmarkPrefixDigests(b *testing.B) {
	for _, size := range []struct{ system, tools, turns int }{{2 << 10, 4, 2}, {40 << 10, 16, 20}} {
		body := agentBody(size.system, size.tools, size.turns)
		name := fmt.Sprintf("body=%dKiB", len(body)>>10)
		b.Run(name+"/head", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := parseHead(body, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/digests", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if len(prefixdigest.Of("team-a", "ns/coder", body)) == 0 {
					b.Fatal("no digests")
				}
			}
		})
	}
}
