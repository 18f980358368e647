package runnerapi

import (
	"encoding/json"
	"testing"
)

func TestPredictedContent(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want, param string
	}{
		{"absent", ``, "", ""},
		{"null", `null`, "", ""},
		{"a string", `{"type":"content","content":"func main() {}"}`, "func main() {}", ""},
		{"text parts, joined", `{"type":"content","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, "ab", ""},
		{"another type", `{"type":"file","content":"x"}`, "", "prediction"},
		{"not an object", `"x"`, "", "prediction"},
		{"a part that is not text", `{"type":"content","content":[{"type":"image_url"}]}`, "", "prediction.content"},
		{"content a number", `{"type":"content","content":3}`, "", "prediction.content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PredictedContent(json.RawMessage(tc.raw))
			switch {
			case tc.param == "" && (err != nil || got != tc.want):
				t.Fatalf("PredictedContent(%s) = %q, %v; want %q", tc.raw, got, err, tc.want)
			case tc.param != "" && (err == nil || err.Param != tc.param || err.Code != CodeInvalidValue):
				t.Fatalf("PredictedContent(%s) = %q, %+v; want a %s naming %s", tc.raw, got, err, CodeInvalidValue, tc.param)
			}
		})
	}
}
