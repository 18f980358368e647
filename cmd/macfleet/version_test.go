package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/version"
)

func TestVersionCommand(t *testing.T) {
	want := version.Get()
	for _, tc := range []struct {
		args    []string
		check   func(out string) bool
		wantErr string
	}{
		{args: nil, check: func(out string) bool { return out == "macfleet "+want.String()+"\n" }},
		{args: []string{"-o", "json"}, check: func(out string) bool {
			var got version.Info
			return json.Unmarshal([]byte(out), &got) == nil && got == want
		}},
		{args: []string{"-o", "yaml"}, wantErr: `--output "yaml": want json`},
	} {
		cmd := newVersionCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("version %v: %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
		case err != nil || !tc.check(out.String()):
			t.Errorf("version %v: %v, printed %q", tc.args, err, out.String())
		}
	}
	if !strings.HasPrefix(root.Version, want.Version) {
		t.Errorf("macfleet --version prints %q; want it to start with %q", root.Version, want.Version)
	}
}
