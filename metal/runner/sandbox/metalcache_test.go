package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunnerCacheDir: two runners get two Metal cache directories, each granted to
// its runner's profile alone; a gone runner's is removed when the next starts, not a
// running runner's, another agent's or anything else in the user cache.
func TestRunnerCacheDir(t *testing.T) {
	userCache, sockets := t.TempDir(), t.TempDir()
	socket := func() string {
		d, err := os.MkdirTemp(sockets, "mf")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	sockA, sockB := socket(), socket()
	dirA, envA, err := runnerCacheDir(userCache, sockA)
	if err != nil {
		t.Fatal(err)
	}
	dirB, envB, err := runnerCacheDir(userCache, sockB)
	if err != nil {
		t.Fatal(err)
	}
	if dirA == dirB || filepath.Dir(dirA) != userCache || filepath.Dir(dirB) != userCache {
		t.Fatalf("runner cache directories %s and %s: want two, in %s", dirA, dirB, userCache)
	}
	for dir, env := range map[string]string{dirA: envA, dirB: envB} {
		if want := "DIRHELPER_USER_DIR_SUFFIX=" + filepath.Base(dir); env != want {
			t.Errorf("environment %q, want %q", env, want)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a directory only its user may open", dir, st, err)
		}
	}
	profile, err := Profile(Policy{Runner: "/opt/macfleet-runner", Model: "/m.gguf", SocketDir: sockA, MetalCacheDir: dirA})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(profile, `(allow file-read* file-write* (subpath "`+dirA+`"))`) {
		t.Errorf("the profile does not grant the runner's own cache %s:\n%s", dirA, profile)
	}
	for _, never := range []string{dirB, `(subpath "` + userCache + `")`, "com.apple.metal"} {
		if strings.Contains(profile, never) {
			t.Errorf("the profile grants %s:\n%s", never, profile)
		}
	}

	// Runner A is gone: its cache goes as runner C starts. A cache of another agent
	// (another socket base), the shared Metal cache and B's stay.
	if err := os.WriteFile(filepath.Join(dirA, "functions.data"), []byte("shader"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sockA); err != nil {
		t.Fatal(err)
	}
	_, otherAgent := runnerCacheName(filepath.Join(t.TempDir(), filepath.Base(sockA)))
	for _, d := range []string{otherAgent, "com.apple.metal"} {
		if err := os.Mkdir(filepath.Join(userCache, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sockC := socket()
	if _, _, err := runnerCacheDir(userCache, sockC); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dirA); !os.IsNotExist(err) {
		t.Errorf("the gone runner's cache %s: %v, want it removed", dirA, err)
	}
	for _, d := range []string{dirB, filepath.Join(userCache, otherAgent), filepath.Join(userCache, "com.apple.metal")} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}

	// A directory left with this runner's name (an earlier runner's socket directory
	// of the same name) is emptied: nothing of it reaches the new runner.
	if err := os.WriteFile(filepath.Join(dirB, "functions.data"), []byte("shader"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runnerCacheDir(userCache, sockB); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(dirB); err != nil || len(left) > 0 {
		t.Errorf("the reused cache %s holds %v (%v), want it empty", dirB, left, err)
	}
}
