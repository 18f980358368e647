package sandbox

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckConnect(t *testing.T) {
	files := Status{Mechanism: "landlock", Enforced: true, Detail: "Landlock ABI 3 confines files but not TCP connects"}
	all := Status{Mechanism: "landlock", Enforced: true, ConnectConfined: true, Detail: "Landlock ABI 4 confines files, TCP"}
	none := Status{Mechanism: "seccomp", Detail: "the kernel has no Landlock"}
	head := []uint16{40001}
	for _, tc := range []struct {
		name   string
		st     Status
		ports  []uint16
		refuse bool
	}{
		{"split head, files only", files, head, true},
		{"split head, connects confined", all, head, false},
		{"runner that connects nowhere, files only", files, nil, false},
		// Refused as UnconfinedError, for the files too.
		{"split head, nothing confined", none, head, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckConnect(tc.st, tc.ports)
			if !tc.refuse {
				if err != nil {
					t.Fatalf("CheckConnect: %v, want nil", err)
				}
				return
			}
			var ce *ConnectUnconfinedError
			if !errors.As(err, &ce) {
				t.Fatalf("CheckConnect: %v, want a *ConnectUnconfinedError", err)
			}
			for _, want := range []string{"Landlock ABI 4", "Linux 6.7", AllowUnconfinedFlag, tc.st.Detail} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal lacks %q: %v", want, err)
				}
			}
		})
	}
}
