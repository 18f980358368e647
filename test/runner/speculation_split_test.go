package e2e

import (
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestSpeculationAcrossTheSplitLink: a replica split across two processes (the head
// and one worker holding half the layers) verifies drafted tokens through the split
// link: a copy-heavy answer keeps drafted tokens, and it is the same with speculation
// off and on, and the same as one process's.
func TestSpeculationAcrossTheSplitLink(t *testing.T) {
	m := speculationModel(t)
	body := `{"model":"m","max_tokens":120,"temperature":0,"logprobs":true,"tools":[` + readTool + `],"messages":[` + readBack(notes) + `]}`
	one := startReady(t, m)
	want := specChat(t, one, body, runnerapi.SpeculationOff)
	one.stop()

	w := startWorker(t, m)
	workerLayers := 1 // of the tiny model's 2
	if _, trained := trainedModel(); trained {
		workerLayers = 4 // of the trained model's 8
	}
	r := startReady(t, m, splitFlags([]*worker{w}, workerLayers)...)
	off := specChat(t, r, body, runnerapi.SpeculationOff)
	on := specChat(t, r, body, runnerapi.SpeculationOn)
	sameAnswers(t, want, off)
	sameAnswers(t, off, on)
	if accepted(on) == 0 {
		t.Fatalf("the split replica kept no drafted token (%q, drafts %+v): the comparison shows nothing",
			on.Choices[0].Message.Text(), on.Usage.CompletionTokensDetails)
	}
	t.Logf("%q: %d tokens, drafts %+v", on.Choices[0].Message.Text(), on.Usage.CompletionTokens, on.Usage.CompletionTokensDetails)
}
