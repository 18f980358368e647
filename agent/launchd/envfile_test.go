package launchd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAttackInstallEnvSecretInPlist: `install --env HF_TOKEN=…` once wrote the token
// into the property list, which every user of the Mac can read. The secret must be
// in a file of mode 0600 that the service reads, and nowhere in the property list.
func TestAttackInstallEnvSecretInPlist(t *testing.T) {
	bootstrapRetry = 0
	const secret = "hf_secretToken123"
	home := t.TempDir()
	for _, svc := range []Service{Agent, Serve} {
		t.Run(svc.Command, func(t *testing.T) {
			args := []string{"--kubeconfig=/etc/macfleet/node.kubeconfig"}
			if svc.Command == Serve.Command {
				args = []string{"--model", "chat=hf://org/repo/m.gguf"}
			}
			p, err := Render(Options{Service: svc, Executable: "/usr/local/bin/macfleet", Home: home, UID: os.Getuid(),
				AgentArgs: args, Env: []string{"HF_TOKEN=" + secret, "HTTPS_PROXY=http://user:pw@proxy.example:3128"}})
			if err != nil {
				t.Fatal(err)
			}
			err = Install(context.Background(), p, func(context.Context, ...string) ([]byte, error) { return nil, nil })
			if err != nil {
				t.Fatal(err)
			}
			plist, err := os.ReadFile(p.PlistPath)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{secret, "user:pw", "EnvironmentVariables"} {
				if bytes.Contains(plist, []byte(v)) {
					t.Errorf("the property list (readable by every user) holds %q:\n%s", v, plist)
				}
			}
			installed, err := Parse(plist)
			if err != nil {
				t.Fatal(err)
			}
			in := &Installed{Args: stringsOf(t, installed["ProgramArguments"])[2:]}
			envPath, ok := in.Flag(EnvFileFlag)
			if !ok || filepath.Dir(envPath) != p.DataDir {
				t.Fatalf("the service is not given %s in its data directory %s: %q", EnvFileFlag, p.DataDir, in.Args)
			}
			fi, err := os.Stat(envPath)
			if err != nil {
				t.Fatal(err)
			}
			if mode := fi.Mode().Perm(); mode != 0o600 {
				t.Errorf("%s has mode %o, want 0600", envPath, mode)
			}
			t.Setenv("HF_TOKEN", "")
			t.Setenv("HTTPS_PROXY", "")
			if err := LoadEnvFile(envPath); err != nil {
				t.Fatal(err)
			}
			if got := os.Getenv("HF_TOKEN"); got != secret {
				t.Errorf("HF_TOKEN after loading the env file = %q, want %q", got, secret)
			}
			if got := os.Getenv("HTTPS_PROXY"); got != "http://user:pw@proxy.example:3128" {
				t.Errorf("HTTPS_PROXY after loading the env file = %q", got)
			}
		})
	}
}

func TestEnvFileRoundTrip(t *testing.T) {
	data, err := EncodeEnv([]string{"B=2", "A=x=y", "B=3", "EMPTY="})
	if err != nil {
		t.Fatal(err)
	}
	if want := "A=x=y\nB=3\nEMPTY=\n"; string(data) != want {
		t.Errorf("EncodeEnv = %q, want %q", data, want)
	}
	got, err := DecodeEnv(append([]byte("# comment\n\n"), data...))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][2]string{{"A", "x=y"}, {"B", "3"}, {"EMPTY", ""}}, got); diff != "" {
		t.Errorf("DecodeEnv (-want +got):\n%s", diff)
	}
}

func TestEnvFileRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  []string
		want string
	}{
		{"line break in a value", []string{"TOKEN=a\nEVIL=1"}, "line break"},
		{"no key", []string{"=x"}, "want KEY=VALUE"},
		{"no =", []string{"HF_TOKEN"}, "want KEY=VALUE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := EncodeEnv(tt.env); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("EncodeEnv(%q) = %v, want an error with %q", tt.env, err, tt.want)
			}
		})
	}
	if _, err := DecodeEnv([]byte("not a pair\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("DecodeEnv of a line without = : %v, want an error naming line 1", err)
	}
}
