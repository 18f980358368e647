package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/engine"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    Size
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512Mi", want: 512 << 20},
		{in: "12Gi", want: 12 << 30},
		{in: "12GiB", want: 12 << 30},
		{in: "2G", want: 2_000_000_000},
		{in: "1.5Gi", want: 3 << 29},
		{in: "twelve", wantErr: "is not a size"},
		{in: "-1Gi", wantErr: "negative"},
		{in: "0.5", wantErr: "whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSize(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseModelFlag(t *testing.T) {
	tests := []struct {
		in      string
		want    Model
		wantErr string
	}{
		{in: "qwen=/m/qwen.gguf", want: Model{Name: "qwen", Path: "/m/qwen.gguf"}},
		{
			in: "qwen=/m/qwen.gguf:ctx=4096,parallel=4,residency=pinned,memory=2Gi,kv=q8_0,alias=q|qw",
			want: Model{Name: "qwen", Path: "/m/qwen.gguf", Settings: engine.Settings{ContextLength: 4096, Parallel: 4, KVCacheType: "q8_0"},
				Residency: ResidencyPinned, Memory: 2 << 30, Aliases: []string{"q", "qw"}},
		},
		{in: "t=/m/t.gguf:threads=3,parallel=2", want: Model{Name: "t", Path: "/m/t.gguf", Settings: engine.Settings{Parallel: 2, Threads: 3}}},
		{in: "t=/m/t.gguf:threads=many", wantErr: "option threads"},
		{in: "e=/m/e.gguf:idle=90s", want: Model{Name: "e", Path: "/m/e.gguf", IdleTimeout: Duration(90 * time.Second)}},
		// A colon that does not start an option list belongs to the path.
		{in: "odd=/m/a:b.gguf", want: Model{Name: "odd", Path: "/m/a:b.gguf"}},
		{in: "odd=/m/a:b/x.gguf:ctx=64", want: Model{Name: "odd", Path: "/m/a:b/x.gguf", Settings: engine.Settings{ContextLength: 64}}},
		{in: "/m/qwen.gguf", wantErr: "want NAME=PATH"},
		{in: "=x.gguf", wantErr: "want NAME=PATH"},
		{in: "q=/m/q.gguf:ctx=lots", wantErr: "option ctx"},
		{in: "q=/m/q.gguf:memory=big", wantErr: "option memory"},
		{in: "c=/m/c.gguf:cache=off", want: Model{Name: "c", Path: "/m/c.gguf", PromptCache: &PromptCache{Enabled: ptr.To(false)}}},
		{in: "c=/m/c.gguf:ctx=64,cache=on,hot=512Mi,ssd=20Gi", want: Model{Name: "c", Path: "/m/c.gguf", Settings: engine.Settings{ContextLength: 64},
			PromptCache: &PromptCache{Enabled: ptr.To(true), HotBytes: ptr.To(Size(512 << 20)), SSDBytes: ptr.To(Size(20 << 30))}}},
		{in: "c=/m/c.gguf:hot=0", want: Model{Name: "c", Path: "/m/c.gguf", PromptCache: &PromptCache{HotBytes: ptr.To(Size(0))}}},
		{in: "c=/m/c.gguf:cache=maybe", wantErr: `option cache: "maybe" is not on or off`},
		{in: "c=/m/c.gguf:ssd=lots", wantErr: "option ssd"},
		// A source for `macfleet serve` to pull: its scheme's colon belongs to the path.
		{in: "q=hf://org/repo/q.gguf", want: Model{Name: "q", Path: "hf://org/repo/q.gguf"}},
		{in: "q=hf://org/repo/q.gguf@v2:ctx=64,sha256=ab12", want: Model{Name: "q", Path: "hf://org/repo/q.gguf@v2",
			SHA256: "ab12", Settings: engine.Settings{ContextLength: 64}}},
		{in: "l=ollama://llama3.2:3b", want: Model{Name: "l", Path: "ollama://llama3.2:3b"}},
		{in: "l=ollama://llama3.2:3b:ctx=64", want: Model{Name: "l", Path: "ollama://llama3.2:3b", Settings: engine.Settings{ContextLength: 64}}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseModelFlag(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseModelFlag(%q) = %+v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("ParseModelFlag(%q) (-want +got):\n%s", tt.in, d)
			}
		})
	}
}

func TestLoadMergeComplete(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	other := filepath.Join(dir, "o.gguf")
	for _, p := range []string{model, other} {
		if err := os.WriteFile(p, []byte("GGUF"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "agent.yaml")
	yamlText := `
listen: 127.0.0.1:9000
apiKeyFile: ` + keyFile + `
memoryCeiling: 12Gi
idleTimeout: 10m
promptCacheDir: ` + dir + `/cache
promptCacheHotBytes: 2Gi
promptCacheSSDBytes: 50Gi
models:
  - name: qwen
    path: ` + model + `
    contextLength: 8192
    parallel: 4
    residency: resident
    aliases: [q]
    promptCache: {hotBytes: 1Gi, ssdBytes: 5Gi}
`
	if err := os.WriteFile(file, []byte(yamlText), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	flags := Config{Listen: "127.0.0.1:0", MemoryCeiling: 8 << 30, RunnerThreads: 2, PromptCacheSSDBytes: ptr.To(Size(0)),
		Models: []Model{{Name: "embed", Path: other, PromptCache: &PromptCache{Enabled: ptr.To(false)}}}}
	got, err := fromFile.Merge(flags).Complete()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "127.0.0.1:0", APIKey: "s3cret", APIKeyFile: keyFile, MemoryCeiling: 8 << 30, RunnerThreads: 2,
		IdleTimeout: Duration(10 * time.Minute), MaxBodyBytes: DefaultMaxBodyBytes,
		PromptCacheDir: filepath.Join(dir, "cache"), PromptCacheHotBytes: ptr.To(Size(2 << 30)), PromptCacheSSDBytes: ptr.To(Size(0)),
		Models: []Model{
			{Name: "qwen", Aliases: []string{"q"}, Path: model, Settings: engine.Settings{ContextLength: 8192, Parallel: 4,
				KVCacheType: "f16"}, Residency: ResidencyResident,
				PromptCache: &PromptCache{HotBytes: ptr.To(Size(1 << 30)), SSDBytes: ptr.To(Size(5 << 30))}},
			{Name: "embed", Path: other, Settings: engine.Settings{KVCacheType: "f16"}, Residency: ResidencyOnDemand,
				PromptCache: &PromptCache{Enabled: ptr.To(false)}},
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("config (-want +got):\n%s", d)
	}
}

func TestLoadRejectsUnknownFields(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:1\nmemoryCeling: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(file); err == nil || !strings.Contains(err.Error(), "memoryCeling") {
		t.Fatalf("Load = %v; want an error naming the unknown field", err)
	}
}

func TestCompleteReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings, one per expected error line
	}{
		{name: "no models", cfg: Config{}, want: []string{"at least one model"}},
		{
			name: "bad listen and body limit",
			cfg: Config{Listen: "8080", MaxBodyBytes: 10, RunnerThreads: -1, RunnerSandbox: "no",
				Models: []Model{{Name: "a", Path: model}}},
			want: []string{`listen: "8080" is not host:port`, "maxBodyBytes: 10 is too small", "runnerThreads: -1",
				`runnerSandbox: runner sandbox "no": want "on" or "off"`},
		},
		{
			name: "bad model fields",
			cfg: Config{Models: []Model{{Name: "a/b", Path: filepath.Join(dir, "missing.gguf"),
				Settings: engine.Settings{Parallel: -1, KVCacheType: "f8", ContextLength: -5}, Residency: "Sometimes"}}},
			want: []string{
				`models[0] (a/b).name: "a/b" may only contain`,
				"models[0] (a/b).path: stat",
				"contextLength: -5 is negative",
				"parallel: -1 is not between",
				`kvCacheType: "f8" is not one of`,
				`residency: "Sometimes" is not OnDemand`,
			},
		},
		{
			name: "several contexts on one Mac",
			cfg:  Config{Models: []Model{{Name: "a", Path: model, Settings: engine.Settings{Parallel: 4, SplitPipeline: 2}}}},
			want: []string{"models[0] (a).splitPipeline: 2 needs a replica split across Macs"},
		},
		{
			name: "duplicates",
			cfg: Config{Models: []Model{
				{Name: "a", Path: model, Aliases: []string{"x", "x"}},
				{Name: "b", Path: model, Aliases: []string{"a"}},
				{Name: "a", Path: model},
			}},
			want: []string{
				`models[0] (a).aliases: "x" is given twice`,
				`models[1] (b).aliases: "a" is already used by model "a"`,
				`models[2] (a).name: "a" is given twice`,
			},
		},
		{
			name: "idle timeout on a pinned model and a directory as path",
			cfg:  Config{Models: []Model{{Name: "p", Path: dir, Residency: "Pinned", IdleTimeout: Duration(time.Minute)}}},
			want: []string{"is not a regular file", "only OnDemand models expire"},
		},
		{
			name: "ceiling too small and tiny slots",
			cfg:  Config{MemoryCeiling: 1 << 20, Models: []Model{{Name: "a", Path: model, Settings: engine.Settings{ContextLength: 8, Parallel: 4}}}},
			want: []string{"memoryCeiling: 1Mi is too small", "fewer than 256 tokens"},
		},
		{
			name: "prompt cache sizes with the cache off",
			cfg: Config{Models: []Model{{Name: "a", Path: model,
				PromptCache: &PromptCache{Enabled: ptr.To(false), HotBytes: ptr.To(Size(1 << 30))}}}},
			want: []string{"models[0] (a).promptCache: hotBytes and ssdBytes need the prompt cache enabled"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.Complete()
			if err == nil {
				t.Fatal("Complete succeeded; want errors")
			}
			ie, ok := err.(*InvalidError)
			if !ok {
				t.Fatalf("error %T %v; want *InvalidError", err, err)
			}
			if len(ie.Errs) != len(tt.want) {
				t.Errorf("got %d errors, want %d:\n%v", len(ie.Errs), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}
