// Package testassets finds the real tokenizer vocabularies and chat templates that
// tests use to build realistic models. They ship as test data of the llama.cpp module
// the runner already depends on, so they are read from the Go module cache at test
// time and never copied into this repository.
package testassets

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Module is the module whose test data holds the assets.
const Module = "github.com/ollama/ollama"

// EnvDir, when set, names a directory laid out as the module's (tokenizer/testdata,
// template) to read instead of the module cache.
const EnvDir = "MACFLEET_TESTASSETS_DIR"

var (
	dirOnce sync.Once
	dir     string
	dirErr  error
)

// ModuleDir is the directory of Module in the module cache (downloaded if needed).
func ModuleDir() (string, error) {
	dirOnce.Do(func() {
		// A machine without Go (the accelerator machine of hack/test-gpu.sh) is given
		// a copy of the few folders the tests read.
		if d := os.Getenv(EnvDir); d != "" {
			dir, dirErr = d, nil
			if _, err := os.Stat(d); err != nil {
				dirErr = fmt.Errorf("%s: %w", EnvDir, err)
			}
			return
		}
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", Module).Output()
		if err == nil && strings.TrimSpace(string(out)) == "" {
			if err = exec.Command("go", "mod", "download", Module).Run(); err == nil {
				out, err = exec.Command("go", "list", "-m", "-f", "{{.Dir}}", Module).Output()
			}
		}
		if err != nil {
			dirErr = fmt.Errorf("locating %s in the module cache: %w", Module, err)
			return
		}
		dir = strings.TrimSpace(string(out))
		if _, err := os.Stat(dir); err != nil {
			dirErr = fmt.Errorf("module directory of %s: %w", Module, err)
		}
	})
	return dir, dirErr
}

// Path is a file of the module.
func Path(rel string) (string, error) {
	d, err := ModuleDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(d, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// ChatTemplate is one real Jinja chat template and the family it belongs to.
type ChatTemplate struct {
	// Family is the template family (chatml, llama3-instruct, ...).
	Family string
	// Index is the template's position in the module's index (families repeat).
	Index int
	// Source is the Jinja text.
	Source string
}

// ID names the template uniquely: family and index.
func (c ChatTemplate) ID() string { return fmt.Sprintf("%02d-%s", c.Index, c.Family) }

// ChatTemplates returns the real chat templates the module indexes.
func ChatTemplates() ([]ChatTemplate, error) {
	p, err := Path("template/index.json")
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var idx []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", p, err)
	}
	out := make([]ChatTemplate, len(idx))
	for i, e := range idx {
		out[i] = ChatTemplate{Family: e.Name, Index: i, Source: e.Template}
	}
	return out, nil
}

// Find returns the first template of family whose source contains all of marks.
func Find(family string, marks ...string) (ChatTemplate, error) {
	all, err := ChatTemplates()
	if err != nil {
		return ChatTemplate{}, err
	}
	for _, t := range all {
		if t.Family != family {
			continue
		}
		ok := true
		for _, m := range marks {
			ok = ok && strings.Contains(t.Source, m)
		}
		if ok {
			return t, nil
		}
	}
	return ChatTemplate{}, fmt.Errorf("no %s template containing %q", family, marks)
}
