package chart

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dockerfileBuild returns the arguments of the Dockerfile's `go build` and the
// environment assignments before it, with the RUN's line continuations joined.
func dockerfileBuild(t *testing.T) (env, args []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.ReplaceAll(string(data), "\\\n", " ")
	var run string
	for line := range strings.Lines(joined) {
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			run = line
		}
	}
	if run == "" {
		t.Fatal("the Dockerfile has no RUN … go build")
	}
	start := strings.Index(run, "CGO_ENABLED")
	if start < 0 {
		t.Fatalf("the Dockerfile's build does not set CGO_ENABLED: %s", run)
	}
	fields := shellFields(run[start:])
	i := slices.Index(fields, "go")
	if i < 0 || i+1 >= len(fields) || fields[i+1] != "build" {
		t.Fatalf("cannot parse the Dockerfile's build: %s", run)
	}
	return fields[:i], fields[i+2:]
}

// buildLikeDockerfile runs the Dockerfile's `go build` here, for this machine's OS and
// architecture, and returns the binary.
func buildLikeDockerfile(t *testing.T) string {
	t.Helper()
	env, args := dockerfileBuild(t)
	bin := filepath.Join(t.TempDir(), "macfleet")
	for i, a := range args {
		if a == "-o" {
			args[i+1] = bin
		}
	}
	var cmdEnv []string
	for _, e := range env {
		if !strings.HasPrefix(e, "GOOS=") && !strings.HasPrefix(e, "GOARCH=") {
			cmdEnv = append(cmdEnv, e)
		}
	}
	cmd := exec.CommandContext(t.Context(), "go", append([]string{"build"}, args...)...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), cmdEnv...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v (the Dockerfile's build): %v\n%s", args, err, out)
	}
	return bin
}

func TestDockerfile(t *testing.T) {
	env, args := dockerfileBuild(t)
	for _, want := range []string{"CGO_ENABLED=0"} {
		if !slices.Contains(env, want) {
			t.Errorf("the Dockerfile's go build runs without %s (env %v)", want, env)
		}
	}
	for _, want := range []string{"-trimpath", "./cmd/macfleet"} {
		if !slices.Contains(args, want) {
			t.Errorf("the Dockerfile's go build lacks %s (args %v)", want, args)
		}
	}
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "FROM ") {
			froms = append(froms, strings.TrimSpace(line))
		}
	}
	if len(froms) < 2 || !strings.Contains(froms[0], "golang:1.26") ||
		!regexp.MustCompile(`^FROM gcr\.io/distroless/static[-a-z0-9]*:nonroot$`).MatchString(froms[len(froms)-1]) {
		t.Errorf("stages %v: want a golang:1.26 builder and a distroless static nonroot final stage", froms)
	}
	for _, want := range []string{"\nUSER 65532:65532\n", "\nENTRYPOINT [\"/macfleet\"]\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the Dockerfile lacks %q", strings.TrimSpace(want))
		}
	}
}

// TestDockerignoreCoversImports checks that the build context keeps every directory
// cmd/macfleet imports from, since .dockerignore lists what enters rather than what
// stays out.
func TestDockerignoreCoversImports(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kept := map[string]bool{}
	for s := bufio.NewScanner(f); s.Scan(); {
		if l := strings.TrimSpace(s.Text()); strings.HasPrefix(l, "!") {
			kept[strings.TrimSuffix(strings.TrimPrefix(l, "!"), "/")] = true
		}
	}
	for _, want := range []string{"go.mod", "go.sum"} {
		if !kept[want] {
			t.Errorf(".dockerignore leaves out %s", want)
		}
	}

	const module = "github.com/macfleet/macfleet/"
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/macfleet")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/macfleet: %v", err)
	}
	var missing []string
	for line := range strings.Lines(string(out)) {
		pkg, ok := strings.CutPrefix(strings.TrimSpace(line), module)
		if !ok {
			continue
		}
		top, _, _ := strings.Cut(pkg, "/")
		if !kept[top] && !slices.Contains(missing, top) {
			missing = append(missing, top)
		}
	}
	if len(missing) > 0 {
		t.Errorf(".dockerignore leaves out %v, which cmd/macfleet imports: add !<dir>/ lines", missing)
	}
}

// shellFields splits a shell command line at blanks outside double quotes and drops
// the quotes, which is all the Dockerfile's build line needs.
func shellFields(line string) []string {
	var fields []string
	var cur strings.Builder
	quoted, inField := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inField = !quoted, true
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			if inField {
				fields = append(fields, cur.String())
				cur.Reset()
				inField = false
			}
		default:
			cur.WriteRune(r)
			inField = true
		}
	}
	if inField {
		fields = append(fields, cur.String())
	}
	return fields
}
