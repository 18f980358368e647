package main

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestUsageCommand runs `macfleet usage` against a real API server holding two
// gateway replicas' TokenUsages of two namespaces, as a team whose RBAC lets it list
// TokenUsages in its own namespace only, and as the administrator.
func TestUsageCommand(t *testing.T) {
	env := testenv.Start(t, testenv.WithScheme(v1alpha1.AddToScheme))
	ctx := t.Context()
	nsA, nsB := testenv.NewNamespace(t, env.Client), testenv.NewNamespace(t, env.Client)
	now := time.Now().UTC()
	today, yesterday := now.Format("2006-01-02"), now.AddDate(0, 0, -1).Format("2006-01-02")
	old := now.AddDate(0, 0, -10).Format("2006-01-02")
	type use = v1alpha1.KeyUsage
	ledgers := []struct {
		ns, gw, day string
		usage       []use
	}{
		{nsA, "gw-0", yesterday, []use{{Key: "ci", Deployment: nsA + "/qwen", Requests: 3, InputTokens: 300, CachedTokens: 100, OutputTokens: 30},
			{Key: "ci", Deployment: nsB + "/llama", Requests: 1, InputTokens: 10, OutputTokens: 5}}},
		{nsA, "gw-1", yesterday, []use{{Key: "ci", Deployment: nsA + "/qwen", Requests: 2, InputTokens: 200, CachedTokens: 50, OutputTokens: 20}}},
		{nsA, "gw-1", today, []use{{Key: "dev", Deployment: nsA + "/qwen", Requests: 1, InputTokens: 7, OutputTokens: 1}}},
		{nsA, "gw-0", old, []use{{Key: "ci", Deployment: nsA + "/qwen", Requests: 50, InputTokens: 5000, OutputTokens: 500}}},
		{nsB, "gw-0", today, []use{{Key: "team-b-secret-key", Deployment: nsB + "/llama", Requests: 4, InputTokens: 40, OutputTokens: 4}}},
	}
	for _, l := range ledgers {
		tu := &v1alpha1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.gw + "-" + l.day},
			Spec: v1alpha1.TokenUsageSpec{Gateway: l.gw, Day: l.day, Usage: l.usage}}
		if err := env.Client.Create(ctx, tu); err != nil {
			t.Fatal(err)
		}
	}

	// Team A may list TokenUsages in its namespace and nothing else.
	const teamUser = "team-a-reader"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "usage-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"tokenusages"}, Verbs: []string{"list"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "usage-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: teamUser}}}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	adminKC := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(adminKC, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(env.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	cur := kc.Contexts[kc.CurrentContext]
	cur.Namespace = nsA // kubectl's default namespace: the command reads it without -n
	kc.AuthInfos[cur.AuthInfo].Impersonate = teamUser
	teamKC := filepath.Join(dir, "team-a.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, teamKC); err != nil {
		t.Fatal(err)
	}

	run := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		cmd := usageCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	records := func(t *testing.T, out string) [][]string {
		t.Helper()
		recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
		if err != nil {
			t.Fatalf("the output is not CSV: %v\n%s", err, out)
		}
		return recs
	}
	// sum adds the number columns of CSV records up, by header.
	sum := func(recs [][]string) map[string]int64 {
		s := map[string]int64{}
		for _, r := range recs[1:] {
			for i, h := range recs[0] {
				if n, err := strconv.ParseInt(r[i], 10, 64); err == nil {
					s[h] += n
				}
			}
		}
		return s
	}

	t.Run("a team reads its namespace as CSV", func(t *testing.T) {
		out, err := run(t, "--kubeconfig", teamKC, "-n", nsA, "--days", "2", "-o", "csv")
		if err != nil {
			t.Fatal(err)
		}
		recs := records(t, out)
		want := [][]string{
			{"day", "key", "requests", "input_tokens", "cached_tokens", "output_tokens"},
			{yesterday, "ci", "6", "510", "150", "55"},
			{today, "dev", "1", "7", "0", "1"},
		}
		if got, w := strings.Join(flat(recs), ","), strings.Join(flat(want), ","); got != w {
			t.Errorf("CSV:\n%s\nwant the rows %v", out, want)
		}
		// The ledgers of the two days, summed over both gateway replicas.
		if got, w := sum(recs), (map[string]int64{"requests": 7, "input_tokens": 517, "cached_tokens": 150, "output_tokens": 56}); !equal(got, w) {
			t.Errorf("totals %v, want %v", got, w)
		}
	})

	t.Run("the kubeconfig's namespace, per deployment, as a table", func(t *testing.T) {
		t.Setenv("KUBECONFIG", teamKC)
		out, err := run(t, "--since", yesterday, "--by-deployment")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) != 5 {
			t.Fatalf("want a header, 3 rows and a total:\n%s", out)
		}
		own, granted := []string{yesterday, "ci", nsA + "/qwen", "5", "500", "150", "50"}, []string{yesterday, "ci", nsB + "/llama", "1", "10", "0", "5"}
		if nsB < nsA {
			own, granted = granted, own // sorted by deployment
		}
		for i, want := range [][]string{
			{"DAY", "KEY", "DEPLOYMENT", "REQUESTS", "INPUT", "CACHED", "OUTPUT"},
			own, granted,
			{today, "dev", nsA + "/qwen", "1", "7", "0", "1"},
			{"TOTAL", "7", "517", "150", "56"},
		} {
			if got := strings.Fields(lines[i]); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("line %d: %q, want the fields %q", i, lines[i], want)
			}
		}
		// Aligned: every line is as wide as the header.
		for _, l := range lines[1:] {
			if len(l) != len(lines[0]) {
				t.Errorf("not aligned:\n%s", out)
				break
			}
		}
		if strings.Contains(out, "team-b-secret-key") || strings.Contains(out, "5000") {
			t.Errorf("another namespace's or an older day's usage shows:\n%s", out)
		}
	})

	t.Run("a team cannot read another namespace or every namespace", func(t *testing.T) {
		for _, args := range [][]string{{"-n", nsB}, {"-A"}} {
			out, err := run(t, append([]string{"--kubeconfig", teamKC}, args...)...)
			if err == nil || !strings.Contains(err.Error(), "forbidden") || strings.Contains(out, "team-b-secret-key") {
				t.Errorf("%v as team A: %v\n%s", args, err, out)
			}
		}
		if _, err := run(t, "--kubeconfig", teamKC, "-A"); err == nil || !strings.Contains(err.Error(), "pass -n NAMESPACE") {
			t.Errorf("-A without the RBAC should say to pass -n: %v", err)
		}
	})

	t.Run("the administrator reads every namespace", func(t *testing.T) {
		out, err := run(t, "--kubeconfig", adminKC, "-A", "--days", "2", "-o", "csv")
		if err != nil {
			t.Fatal(err)
		}
		recs := records(t, out)
		if got := strings.Join(recs[0], ","); got != "day,namespace,key,requests,input_tokens,cached_tokens,output_tokens" {
			t.Errorf("header %s", got)
		}
		if got, w := sum(recs), (map[string]int64{"requests": 11, "input_tokens": 557, "cached_tokens": 150, "output_tokens": 60}); !equal(got, w) {
			t.Errorf("totals %v, want %v", got, w)
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"-o", "json"}, `-o "json": want table or csv`},
			{[]string{"--days", "0"}, "--days 0: count at least 1 day"},
			{[]string{"--since", "yesterday"}, `--since "yesterday": want a UTC day as YYYY-MM-DD`},
		} {
			if _, err := run(t, append([]string{"--kubeconfig", adminKC, "-n", nsA}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want %q", c.args, err, c.want)
			}
		}
	})
}

func flat(recs [][]string) []string {
	var out []string
	for _, r := range recs {
		out = append(out, strings.Join(r, "|"))
	}
	return out
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
