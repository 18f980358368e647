package runnerapi

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// TestSplitAuth: the frame a worker's agent sends passes; a wrong secret, another
// first frame or a short one fails, reading no more than the frame's fixed size.
func TestSplitAuth(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, SplitSecretBytes)
	other := bytes.Repeat([]byte{8}, SplitSecretBytes)
	hello := append([]byte{56, 0, 0, 0, 1}, make([]byte, 56)...)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"the secret", SplitAuthFrame(secret), ""},
		{"another secret", SplitAuthFrame(other), "wrong secret"},
		{"a runner's greeting first", hello, "not the authentication frame"},
		{"a short frame", SplitAuthFrame(secret)[:20], "no authentication frame"},
		{"a claimed size of 2 GiB", append([]byte{0, 0, 0, 0x80, SplitAuth}, secret...), "not the authentication frame"},
	} {
		r := bytes.NewReader(append(tc.in, "rest"...))
		err := ReadSplitAuth(r, secret)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if tc.want == "" && r.Len() != 4 {
			t.Errorf("%s: %d bytes left, want the 4 after the frame", tc.name, r.Len())
		}
	}
	for _, tc := range []struct {
		in   string
		want []byte
		bad  bool
	}{
		{hex.EncodeToString(secret) + "\n", secret, false},
		{hex.EncodeToString(secret), secret, false},
		{"", nil, true},
		{"zz\n", nil, true},
		{hex.EncodeToString(secret[:8]) + "\n", nil, true},
		{hex.EncodeToString(secret) + "ff", nil, true},
	} {
		got, err := ReadWorkerSecret(strings.NewReader(tc.in))
		if (err != nil) != tc.bad || !bytes.Equal(got, tc.want) {
			t.Errorf("ReadWorkerSecret(%q) = %x, %v", tc.in, got, err)
		}
	}
}
