package sandbox

import (
	"strconv"
	"strings"
	"testing"
)

func TestLandlockStatus(t *testing.T) {
	for _, tc := range []struct {
		abi                      int
		enforced, connect        bool
		mentions, doesNotMention []string
	}{
		{abi: 0, mentions: []string{"no Landlock", "Linux 5.13"}},
		{abi: 1, enforced: true, mentions: []string{"Landlock ABI 1", "not TCP connects", "Landlock ABI 4, Linux 6.7", AllowUnconfinedFlag},
			doesNotMention: []string{", TCP"}},
		{abi: 3, enforced: true, mentions: []string{"Landlock ABI 3", "not TCP connects", "refused"}, doesNotMention: []string{", TCP"}},
		{abi: 4, enforced: true, connect: true, mentions: []string{"Landlock ABI 4 confines files, TCP;"}, doesNotMention: []string{"not TCP"}},
		{abi: 10, enforced: true, connect: true, mentions: []string{"files, TCP, signals and abstract unix sockets, pathname unix sockets, UDP"}},
	} {
		t.Run(strconv.Itoa(tc.abi), func(t *testing.T) {
			st := landlockStatus(tc.abi, "")
			if st.Enforced != tc.enforced || st.ConnectConfined != tc.connect {
				t.Errorf("enforced %v, connects confined %v; want %v, %v (%s)", st.Enforced, st.ConnectConfined, tc.enforced, tc.connect, st.Detail)
			}
			for _, want := range tc.mentions {
				if !strings.Contains(st.Detail, want) {
					t.Errorf("the detail lacks %q: %s", want, st.Detail)
				}
			}
			for _, not := range tc.doesNotMention {
				if strings.Contains(st.Detail, not) {
					t.Errorf("the detail says %q: %s", not, st.Detail)
				}
			}
		})
	}
}

// TestLandlockABIEnv: the seam lowers the ABI and says so; it never raises it.
func TestLandlockABIEnv(t *testing.T) {
	kernel := kernelABI()
	for _, tc := range []struct {
		env  string
		want int
	}{
		{"", kernel}, {"3", min(3, kernel)}, {"0", 0}, {"not a number", 0}, {"-2", 0}, {strconv.Itoa(kernel + 5), kernel},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(LandlockABIEnv, tc.env)
			abi, note := landlockABI()
			if abi != tc.want {
				t.Errorf("%s=%q: ABI %d, want %d", LandlockABIEnv, tc.env, abi, tc.want)
			}
			if capped := abi < kernel; capped != strings.Contains(note, LandlockABIEnv) {
				t.Errorf("%s=%q: note %q; want it to name the cap exactly when it lowers the ABI", LandlockABIEnv, tc.env, note)
			}
			if st := Probe(); st.Enforced != (abi > 0) {
				t.Errorf("%s=%q: Probe %+v", LandlockABIEnv, tc.env, st)
			}
		})
	}
}
