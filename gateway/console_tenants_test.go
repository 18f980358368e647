package gateway_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/browsertest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// Team B's secrets on the attack fleet: none may reach team A's key.
const (
	teamBSource  = "https://models.example/team-b-secret-weights.gguf"
	teamBDigest  = "sha256:b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	teamBPrivate = "b-private"
	teamBReplica = "b-shared-0"
	teamBKeyName = "b-ci-secret-name"
	teamBTokens  = 987654
	adminKey     = "console-admin-key"
	teamAKey     = "team-a-key-0123456789abcdef"
	teamBKey     = "team-b-key-0123456789abcdef"
)

// teamsFleet is a gateway running as its own identity with an admin key and both
// teams' keys, over two Macs and two namespaces: team A's "tiny" (a real agent
// behind it) and a replica of team A's split across both Macs, team B's private
// deployment and its "b-shared" granted to team A, with
// condition messages that carry team B's source and digest and both teams'
// TokenUsage ledgers.
type teamsFleet struct {
	g          runningGateway
	a, b       *fleet
	macA, macB string
	agent      string
}

func newTeamsFleet(t *testing.T) teamsFleet {
	e, agent, keys := realAgent(t, adminKey)
	g := startGateway(t, e, gateway.Config{RestConfig: asGateway(t, e), APIKeysFile: keys, TenantKeys: true,
		ColdStartTimeout: 30 * time.Second})
	g.key = adminKey
	tf := teamsFleet{g: g, agent: agent,
		a: &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)},
		b: &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}}
	a, b := tf.a, tf.b
	tf.macA, tf.macB = "mac-a-"+a.ns, "mac-b-"+a.ns
	a.node(tf.macA, metav1.ConditionTrue)
	a.node(tf.macB, metav1.ConditionTrue)

	a.deployment("tiny", "", 1)
	a.replica("tiny-0", "tiny", tf.macA)
	a.setReplica("tiny-0", metav1.ConditionTrue, agent)
	a.splitReplica("big-0", "big", tf.macA, tf.macB)

	for _, d := range []struct {
		name, served string
		access       []string
	}{{teamBPrivate, "", nil}, {"b-shared", "b-llama", []string{a.ns}}} {
		md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: d.name},
			Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: teamBSource, ServedName: d.served}, Replicas: ptr.To(int32(1))}}
		if d.access != nil {
			md.Spec.Access = &mfv1.Access{Namespaces: d.access}
		}
		if err := b.c.Create(t.Context(), md); err != nil {
			t.Fatal(err)
		}
		b.cleanup(md)
		md.Status.Replicas, md.Status.ReadyReplicas = 1, 1
		md.Status.Nodes = []string{tf.macB}
		meta.SetStatusCondition(&md.Status.Conditions, metav1.Condition{Type: mfv1.DeploymentAvailable, Status: metav1.ConditionFalse,
			Reason: "Test", Message: "blob " + teamBDigest + " of " + teamBSource + " on " + tf.macB})
		if err := b.c.Status().Update(t.Context(), md); err != nil {
			t.Fatal(err)
		}
	}
	b.replica(teamBReplica, "b-shared", tf.macB)
	b.setReplica(teamBReplica, metav1.ConditionTrue, agent)
	b.updateReplica(teamBReplica, func(s *mfv1.ModelReplicaStatus) {
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: mfv1.ReplicaDownloaded, Status: metav1.ConditionFalse,
			Reason: "Test", Message: teamBDigest})
		s.LastUnload = &mfv1.UnloadReport{Reason: "Pressure", FreedBytes: 4242424242, Outcome: mfv1.UnloadSettled, Time: metav1.Now()}
	})

	for ns, k := range map[*fleet][2]string{a: {"a-ci", teamAKey}, b: {teamBKeyName, teamBKey}} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.ns, Name: k[0]}, Type: tenancy.SecretType,
			Data: map[string][]byte{tenancy.KeyField: []byte(k[1])}}
		if err := ns.c.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		ns.cleanup(s)
	}
	day := time.Now().UTC().Format("2006-01-02")
	for _, l := range []struct {
		f        *fleet
		key, dep string
		tokens   int64
	}{{a, "a-ci", b.ns + "/b-shared", 1234}, {b, teamBKeyName, b.ns + "/" + teamBPrivate, teamBTokens}} {
		tu := &mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: l.f.ns, Name: "gw-0-" + day},
			Spec: mfv1.TokenUsageSpec{Gateway: "gw-0", Day: day,
				Usage: []mfv1.KeyUsage{{Key: l.key, Deployment: l.dep, Requests: 3, InputTokens: l.tokens, OutputTokens: 7}}}}
		if err := l.f.c.Create(t.Context(), tu); err != nil {
			t.Fatal(err)
		}
		l.f.cleanup(tu)
	}
	waitModel(t, g, "tiny", a.ns, 1)
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := get(g.url+"/v1/models", teamAKey)
		return code == http.StatusOK && strings.Contains(body, "b-llama"), fmt.Sprintf("team A's key: %d %s", code, body)
	})
	return tf
}

// splitReplica is a replica of deployment split across macs (the head on the first),
// unloaded on each: its spec.split and status.shards name every Mac, which the
// console's Unloads page lists shard by shard.
func (f *fleet) splitReplica(name, deployment string, macs ...string) {
	f.t.Helper()
	split := &mfv1.ReplicaSplit{}
	for i, m := range macs {
		split.Shards = append(split.Shards, mfv1.ReplicaShard{Node: m, FirstLayer: int32(i), LastLayer: int32(i), Memory: resource.MustParse("1Gi")})
	}
	r := &mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{mfv1.LabelDeployment: deployment}},
		Spec: mfv1.ModelReplicaSpec{
			Template:          mfv1.ModelReplicaTemplate{Model: mfv1.ModelSource{Source: "https://models.example/big.gguf"}},
			TemplateHash:      "h1",
			MemoryReservation: resource.MustParse("2Gi"),
			NodeName:          macs[0],
			Split:             split,
		},
	}
	if err := f.c.Create(f.t.Context(), r); err != nil {
		f.t.Fatal(err)
	}
	f.cleanup(r)
	f.updateReplica(name, func(s *mfv1.ModelReplicaStatus) {
		for _, m := range macs {
			s.Shards = append(s.Shards, mfv1.ShardStatus{Node: m, Phase: mfv1.ReplicaDraining,
				LastUnload: &mfv1.UnloadReport{Reason: "Deleted", FreedBytes: 1 << 30, Outcome: mfv1.UnloadSettled, Time: metav1.Now()}})
		}
		s.LastUnload = s.Shards[0].LastUnload.DeepCopy() // the head's, repeated in its entry
	})
}

// secretsOfB is everything of team B's (and of the Macs) that team A's key must never
// see on any page.
func (tf teamsFleet) secretsOfB() []string {
	return []string{teamBSource, teamBDigest, teamBPrivate, teamBReplica, teamBKeyName, fmt.Sprint(teamBTokens), "4242424242",
		tf.macA, tf.macB, tf.agent}
}

// TestConsoleTeamKeyOverHTTP: team A's key on every console page and the playground's
// chat, with plain HTTP, gets nothing of team B's; the fleet page and team B's usage
// answer 403; an admin key sees both teams and the Macs.
func TestConsoleTeamKeyOverHTTP(t *testing.T) {
	tf := newTeamsFleet(t)
	ui := tf.g.url + "/ui"
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/", http.StatusForbidden, "needs an admin key"},
		{"/models", http.StatusOK, "shared with your namespace by " + tf.b.ns},
		{"/unloads", http.StatusOK, "recent unloads"},
		{"/playground", http.StatusOK, `value="b-llama"`},
		{"/usage", http.StatusOK, "1234"},
		{"/usage?namespace=" + tf.a.ns + "&days=3", http.StatusOK, tf.b.ns + "/b-shared"},
		{"/usage?namespace=" + tf.b.ns, http.StatusForbidden, "its own namespace&#39;s usage"},
	} {
		code, body := get(ui+c.path, teamAKey)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("GET %s with team A's key: %d, want %d with %q:\n%s", c.path, code, c.code, c.want, body)
		}
		for _, s := range tf.secretsOfB() {
			if strings.Contains(body, s) {
				t.Errorf("GET %s with team A's key shows %q", c.path, s)
			}
		}
	}
	// The playground's chat calls only what the key may use: team B's private model
	// is answered like a model that does not exist.
	req, _ := http.NewRequest(http.MethodPost, ui+"/chat", strings.NewReader(`{"model":"`+tf.b.ns+`/`+teamBPrivate+`","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+teamAKey)
	req.Header.Set("X-Macfleet-Console", "playground")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the playground's chat to team B's private model with team A's key: %d, want 404", resp.StatusCode)
	}

	// An admin key sees both teams and the Macs.
	for path, want := range map[string][]string{"/": {tf.macA, tf.macB}, "/models": {teamBPrivate, teamBDigest, teamBReplica, tf.macB},
		"/unloads": {teamBReplica, "4242424242"}, "/usage?namespace=" + tf.b.ns: {teamBKeyName, fmt.Sprint(teamBTokens)}} {
		code, body := get(ui+path, adminKey)
		for _, w := range want {
			if code != http.StatusOK || !strings.Contains(body, w) {
				t.Errorf("GET %s with the admin key: %d, lacks %q", path, code, w)
			}
		}
	}
}

// TestConsoleTeamKeyInBrowser signs in with team A's key in headless Chromium: it
// lands on the models page, the fleet page is a 403 page, the playground lists only
// what the key may use and streams from team A's own model, and a playground request
// forged for team B's private model fails as a missing model.
func TestConsoleTeamKeyInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	tf := newTeamsFleet(t)
	ui := tf.g.url + "/ui"
	art := browsertest.ArtifactDir(t)
	ctx := browsertest.New(t, bin, 4*time.Minute)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(ui+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), teamAKey),
		chromedp.Click(chromedp.CSS(`form.login button`)),
		chromedp.WaitVisible(chromedp.CSS(`section.deployment`)),
		browsertest.Screenshot(art, "team-models.png"),
	); err != nil {
		t.Fatalf("signing in with team A's key: %v", err)
	}
	shown := func() string {
		t.Helper()
		html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.pathname + "\n" + document.documentElement.outerHTML`))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range tf.secretsOfB() {
			if strings.Contains(html, s) {
				t.Errorf("the browser shows team A %q", s)
			}
		}
		return html
	}
	if page := shown(); !strings.HasPrefix(page, "/ui/models\n") || !strings.Contains(page, "b-llama") {
		t.Errorf("after signing in with team A's key: %.300s", page)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/"), chromedp.WaitVisible(chromedp.CSS(`p.error`))); err != nil {
		t.Fatal(err)
	}
	if page := shown(); !strings.Contains(page, "needs an admin key") {
		t.Errorf("the fleet page with team A's key: %.500s", page)
	}

	// The playground lists team A's model and the one granted to it, nothing else.
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/playground"), chromedp.WaitVisible(chromedp.CSS(`#pg-model`))); err != nil {
		t.Fatal(err)
	}
	options, err := browsertest.PlaygroundModels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"b-llama", "tiny"}; !slices.Equal(options, want) {
		t.Errorf("the playground offers team A %v, want %v", options, want)
	}
	shown()
	browsertest.Playground(t, ctx, ui+"/playground", "tiny", art, "team-playground.png")

	// A forged choice of team B's private model is refused like a missing model.
	forged := tf.b.ns + "/" + teamBPrivate
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/playground"), chromedp.WaitVisible(chromedp.CSS(`#pg-model`)),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector("#pg-model").add(new Option(%q, %q, true, true))`, forged, forged)),
		chromedp.Click(chromedp.CSS(`#playground button`)),
		chromedp.WaitVisible(chromedp.CSS(`#pg-answer[data-done]`))); err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#pg-status`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(status, "Failed: 404") || strings.Contains(status, teamBSource) {
		t.Errorf("the playground's request for %s with team A's key: %q", forged, status)
	}
}
