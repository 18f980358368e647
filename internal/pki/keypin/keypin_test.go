package keypin

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/pki"
)

func mustKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustFP(t *testing.T, k *ecdsa.PrivateKey) string {
	t.Helper()
	fp, err := Fingerprint(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func mustProve(t *testing.T, prev *ecdsa.PrivateKey, node string, next *ecdsa.PrivateKey) string {
	t.Helper()
	p, err := Prove(prev, node, next.Public())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	pinned, next, thief := mustKey(t), mustKey(t), mustKey(t)
	pin := mustFP(t, pinned)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	edDER, _ := x509.MarshalPKIXPublicKey(edPub)
	b64 := base64.RawURLEncoding.EncodeToString
	good := mustProve(t, pinned, "mac-1", next)
	sig := good[strings.Index(good, ".")+1:]
	byThief := mustProve(t, thief, "mac-1", next)
	thiefSig := byThief[strings.Index(byThief, ".")+1:]

	for _, c := range []struct {
		name   string
		req    Request
		sign   bool
		pin    string
		whyHas []string
	}{
		{name: "not enrolled", req: Request{Node: "mac-1", Key: next.Public()},
			whyHas: []string{"no binding Secret macfleet-nodes/mac-1-credential", "macfleet nodes credentials mac-1"}},
		{name: "first key after enrolment is pinned", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true},
			sign: true, pin: mustFP(t, next), whyHas: []string{"now pinned"}},
		{name: "the pinned key again", req: Request{Node: "mac-1", Key: pinned.Public(), Enrolled: true, Pin: pin},
			sign: true, pin: pin},
		{name: "the pinned key with a stray proof", req: Request{Node: "mac-1", Key: pinned.Public(), Enrolled: true, Pin: pin, Proof: "junk"},
			sign: true, pin: pin},
		{name: "a stolen token asks for its own key", req: Request{Node: "mac-1", Key: thief.Public(), Enrolled: true, Pin: pin},
			pin: pin, whyHas: []string{"not node mac-1's pinned key " + pin, "carries no " + ProofAnnotation,
				"macfleet nodes credentials mac-1", "macfleet nodes revoke mac-1"}},
		{name: "rotation proven by the pinned key", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true, Pin: pin, Proof: good},
			sign: true, pin: mustFP(t, next), whyHas: []string{"rotates from its pinned key " + pin}},
		{name: "the Mac's proof replayed for the thief's key", req: Request{Node: "mac-1", Key: thief.Public(), Enrolled: true, Pin: pin, Proof: good},
			pin: pin, whyHas: []string{"does not verify"}},
		{name: "a proof made for another Mac", req: Request{Node: "mac-2", Key: next.Public(), Enrolled: true, Pin: pin,
			Proof: mustProve(t, pinned, "mac-1", next)}, pin: pin, whyHas: []string{"does not verify", "node mac-2"}},
		{name: "the thief proves with its own key", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true, Pin: pin,
			Proof: byThief}, pin: pin, whyHas: []string{"signed by key " + mustFP(t, thief), "not node mac-1's pinned key"}},
		{name: "the thief swaps the pinned public key into the proof", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true, Pin: pin,
			Proof: b64(mustDER(t, pinned)) + "." + thiefSig},
			pin: pin, whyHas: []string{"does not verify"}},
		{name: "garbled proof", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true, Pin: pin, Proof: "no-dot"},
			pin: pin, whyHas: []string{"not <previous key>.<signature>"}},
		{name: "proof by a non-ECDSA key", req: Request{Node: "mac-1", Key: next.Public(), Enrolled: true, Pin: pin, Proof: b64(edDER) + "." + sig},
			pin: pin, whyHas: []string{"not ECDSA"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.req)
			if d.Sign != c.sign || d.Pin != c.pin {
				t.Errorf("Decide = sign %v pin %q (%s); want sign %v pin %q", d.Sign, d.Pin, d.Why, c.sign, c.pin)
			}
			for _, w := range c.whyHas {
				if !strings.Contains(d.Why, w) {
					t.Errorf("why %q lacks %q", d.Why, w)
				}
			}
		})
	}
}

func mustDER(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return der
}
