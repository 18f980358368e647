package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackCraftedGGUFHeader: a tenant deploys a source whose GGUF header of a few
// hundred bytes declares a 256 MiB string in a file of 8 GiB (sparse), or 2^25
// layers; the manager, which reads every deployment's header, must say in the
// deployment's condition which limit the header went over, and go on estimating
// other deployments. Before the limits the first cost the manager half a GiB per
// read (and ended in an unrelated error), and the second panicked the estimator in
// every reconcile of the deployment, which never got a condition.
func TestAttackCraftedGGUFHeader(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	crafted := map[string]struct {
		header []byte
		size   int64
		limit  string
	}{
		"string": {new(ggufsynth.Raw).String("general.architecture", "llama").
			StringLen("general.name", 256<<20, nil).Bytes(), 8 << 30, "string length"},
		"layers": {new(ggufsynth.Raw).String("general.architecture", "llama").
			Uint64("llama.block_count", 1<<25).Uint32("llama.feed_forward_length", 64).
			Uint32("llama.embedding_length", 64).Uint32("llama.attention.head_count", 1).
			Tensor("token_embd.weight", 0, 64, 16).Bytes(), 0, "block count"},
	}
	for name, c := range crafted {
		file := fmt.Sprintf("crafted-%s-%s.gguf", ns, name)
		p := filepath.Join(fleet.ModelsDir, file)
		if err := os.WriteFile(p, c.header, 0o644); err != nil {
			t.Fatal(err)
		}
		if c.size > 0 {
			if err := os.Truncate(p, c.size); err != nil { // sparse: no disk, the server says 8 GiB
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { _ = os.Remove(p) })
		create(t, deployment(ns, "crafted-"+name, 1, func(md *v1alpha1.ModelDeployment) {
			md.Spec.Model.Source = fleet.ModelsURL + "/" + file
		}))
	}
	for name, c := range crafted {
		testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
			var md v1alpha1.ModelDeployment
			if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "crafted-" + name}, &md); err != nil {
				return false, err.Error()
			}
			for _, cond := range md.Status.Conditions {
				if cond.Type == v1alpha1.DeploymentProgressing && cond.Reason == v1alpha1.ReasonEstimateFailed &&
					strings.Contains(cond.Message, "declares a "+c.limit) && strings.Contains(cond.Message, "over the limit of") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("crafted-%s: conditions %+v, want %s/%s naming the %s limit", name, md.Status.Conditions,
				v1alpha1.DeploymentProgressing, v1alpha1.ReasonEstimateFailed, c.limit)
		})
	}
	// The manager is still there: an honest deployment gets its estimate.
	create(t, deployment(ns, "honest", 0))
	testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "honest"}, &md); err != nil {
			return false, err.Error()
		}
		return md.Status.EstimatedMemory != nil, fmt.Sprintf("honest: status %+v", md.Status)
	})
}

// bombTemplate is a chat template that a model's publisher could ship: it renders
// chatml, and a message that says "recurse" or "double" sets off a recursive macro or
// a string doubled 27 times (128 MiB).
const bombTemplate = `{% macro deep(n) %}{{ deep(n + 1) }}{% endmacro %}` +
	`{% for m in messages %}{% set c = m.content|string %}` +
	`{% if 'recurse' in c %}{{ deep(0) }}{% elif 'double' in c %}{% set ns = namespace(s='x') %}` +
	`{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% endif %}` +
	"<|im_start|>{{ m.role }}\n{{ c }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

// TestAttackBombsThroughTheGateway: a tenant's model carries a chat template that
// recurses or doubles a string when a message asks it to, and a client sends a
// response_format schema whose grammar would have a hundred thousand rules; through
// the gateway each gets a 400 in its API's shape (OpenAI, Anthropic) naming the limit,
// and the replica's runner and agent go on serving. Before the limits the recursion
// overflowed the runner's stack and killed it (every request in flight on the replica
// failed), the doubling answered 200 after building 128 MiB strings, and the schema
// went to llama.cpp's converter.
func TestAttackBombsThroughTheGateway(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	replicas := deployTemplate(t, ns, "bomb", bombTemplate)
	model := ns + "/bomb"
	before := runnersOn(t, replicas[0].Spec.NodeName)

	post := func(path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, fleet.GatewayURL+path, strings.NewReader(body))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	openAI := func(body, param, limit string) {
		t.Helper()
		code, b := post("/v1/chat/completions", body)
		var e struct {
			Error struct{ Message, Type, Param string }
		}
		if err := json.Unmarshal(b, &e); err != nil || code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" ||
			e.Error.Param != param || !strings.Contains(e.Error.Message, limit) {
			t.Errorf("OpenAI: %d %s, want a 400 invalid_request_error on %s naming the %s", code, b, param, limit)
		}
	}
	chatBody := func(content, extra string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]%s}`, model, content, extra)
	}
	openAI(chatBody("recurse", ""), "messages", "call depth limit")
	openAI(chatBody("double", ""), "messages", "string size limit")
	openAI(chatBody("hi", `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","maxLength":100000}}}`),
		"response_format.json_schema.schema", "schema weight limit")

	code, b := post("/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"recurse"}]}`, model))
	var ae struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(b, &ae); err != nil || code != http.StatusBadRequest || ae.Type != "error" ||
		ae.Error.Type != "invalid_request_error" || !strings.Contains(ae.Error.Message, "call depth limit") {
		t.Errorf("Anthropic: %d %s, want a 400 invalid_request_error naming the call depth limit", code, b)
	}

	// The runner and the agent are still there: an ordinary request succeeds, and
	// every runner process of the replica's Mac is the one from before the bombs.
	if code, b := post("/v1/chat/completions", chatBody("hi", "")); code != http.StatusOK {
		t.Fatalf("an ordinary request after the bombs: %d %s", code, b)
	}
	after := runnersOn(t, replicas[0].Spec.NodeName)
	for pid := range before {
		if !after[pid] {
			t.Errorf("runner %d of %s died during the bombs (runners now: %v)", pid, replicas[0].Spec.NodeName, after)
		}
	}
}

// runnersOn is the set of runner PIDs that node's agent started.
func runnersOn(t *testing.T, node string) map[int]bool {
	t.Helper()
	rs, err := fleet.Runners()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, r := range rs {
		if r.Node == node {
			out[r.PID] = true
		}
	}
	if len(out) == 0 {
		t.Fatalf("no runner on %s", node)
	}
	return out
}

// TestAttackTemplateNestedAtLoad: a model's chat template nests an expression a
// hundred thousand parentheses deep (a million would overflow the stack of a
// recursive parser while the runner loads it); the runner must refuse the template at
// load, serve with llama.cpp's built-in templates, and the replica's Loaded condition
// must say so and why. Before the limit the template parsed, at a cost in stack that
// grows with the nesting, and nothing told the tenant.
func TestAttackTemplateNestedAtLoad(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	replicas := deployTemplate(t, ns, "nested",
		"{{ "+strings.Repeat("(", 100000)+"1"+strings.Repeat(")", 100000)+" }}"+ggufsynth.ChatMLTemplate)
	// The pool reads the runner's chat rendering after the load, so the condition
	// says it shortly after Ready.
	testenv.Eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		var mr v1alpha1.ModelReplica
		if err := fleet.Client.Get(t.Context(), client.ObjectKeyFromObject(&replicas[0]), &mr); err != nil {
			return false, err.Error()
		}
		loaded := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaLoaded)
		return loaded != nil && loaded.Status == metav1.ConditionTrue &&
				strings.Contains(loaded.Message, "chat template is not used") && strings.Contains(loaded.Message, "nested deeper than 256"),
			fmt.Sprintf("Loaded condition %+v, want True saying the template is not used because it nests too deep", loaded)
	})
	c := gatewayClient()
	if _, err := chat(t.Context(), c, ns+"/nested", false); err != nil {
		t.Errorf("a chat request with the built-in template: %v", err)
	}
}

// deployTemplate deploys one replica of the tiny model with chatTemplate as its chat
// template, as ns/name, and waits until it is ready.
func deployTemplate(t *testing.T, ns, name, chatTemplate string) []v1alpha1.ModelReplica {
	t.Helper()
	spec := ggufsynth.Tiny()
	spec.ChatTemplate = chatTemplate
	file := name + "-" + ns + ".gguf"
	p := filepath.Join(fleet.ModelsDir, file)
	if err := ggufsynth.Write(p, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(p) })
	create(t, deployment(ns, name, 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/" + file
	}))
	return waitReady(t, ns, name, 1, 3*time.Minute)
}
