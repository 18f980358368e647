package store

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLocalFileDirs: absolute directories, cleaned; a relative one is refused.
func TestLocalFileDirsAreAbsolute(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []string
		want []string
		err  string
	}{
		{name: "none"},
		{name: "cleaned", in: []string{"/opt/models/", "/Volumes/m/../n"}, want: []string{"/opt/models", "/Volumes/n"}},
		{name: "relative", in: []string{"/opt/models", "models"}, err: `"models": want an absolute directory`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LocalFileDirs(tt.in)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("dirs (-want +got):\n%s", d)
			}
		})
	}
}
