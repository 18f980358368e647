package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func mustTLSCert(t *testing.T, ca *CA, id Identity, at time.Time) *tls.Certificate {
	t.Helper()
	c, key := mustKeyAndLeaf(t, ca, id, at)
	return &tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c}
}

func mustSign(t *testing.T, st StateTicket, cert *tls.Certificate) string {
	t.Helper()
	s, err := SignTicket(st, cert)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tamper re-encodes s with its claims changed by edit and its signature kept.
func tamper(t *testing.T, s string, edit func(*StateTicket)) string {
	t.Helper()
	env, st, err := decodeTicket(s)
	if err != nil {
		t.Fatal(err)
	}
	edit(&st)
	if env.Claims, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// signUnchecked signs st as SignTicket does but without its lifetime check: a
// gateway that would sign anything.
func signUnchecked(t *testing.T, st StateTicket, cert *tls.Certificate) string {
	t.Helper()
	claims, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	sum := ticketDigest(claims)
	sig, err := cert.PrivateKey.(*ecdsa.PrivateKey).Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ticketEnvelope{Claims: claims, Chain: cert.Certificate, Sig: sig})
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestStateTicket: a ticket signed by a gateway of the fleet grants exactly the Mac,
// source, model and digest it names until it expires; anything else is refused with
// the reason.
func TestStateTicket(t *testing.T) {
	ca := mustCA(t, t0)
	other := mustCA(t, t0)
	gw := mustTLSCert(t, ca, Gateway("gw-1"), t0)
	mac := mustTLSCert(t, ca, Node("mac-2"), t0)
	foreignGW := mustTLSCert(t, other, Gateway("gw-1"), t0)
	roots := Pool([]*x509.Certificate{ca.Cert})
	claims := StateTicket{Target: "mac-2", Source: "mac-1", Model: "team-a/chat-0", Digest: "00112233aabbccdd",
		Partition: "team-a", Issued: t0, Expires: t0.Add(20 * time.Second)}
	good := mustSign(t, claims, gw)
	type ask struct{ target, source, model, digest string }
	mine := ask{"mac-2", "mac-1", "team-a/chat-0", "00112233aabbccdd"}
	for _, tc := range []struct {
		name    string
		ticket  string
		now     time.Time
		ask     ask
		wantErr string
	}{
		{name: "valid", ticket: good, now: t0.Add(5 * time.Second), ask: mine},
		{name: "valid until the last instant", ticket: good, now: t0.Add(20*time.Second - time.Nanosecond), ask: mine},
		{name: "expired", ticket: good, now: t0.Add(20 * time.Second), ask: mine, wantErr: "expired"},
		{name: "another Mac presents it", ticket: good, now: t0, ask: ask{"mac-3", "mac-1", "team-a/chat-0", "00112233aabbccdd"},
			wantErr: `for Mac "mac-2", not "mac-3"`},
		{name: "presented to another source", ticket: good, now: t0, ask: ask{"mac-2", "mac-9", "team-a/chat-0", "00112233aabbccdd"},
			wantErr: `fetching from Mac "mac-1", not "mac-9"`},
		{name: "another digest", ticket: good, now: t0, ask: ask{"mac-2", "mac-1", "team-a/chat-0", "ffffffffffffffff"},
			wantErr: `digest "00112233aabbccdd", not "ffffffffffffffff"`},
		{name: "another model", ticket: good, now: t0, ask: ask{"mac-2", "mac-1", "team-b/chat-0", "00112233aabbccdd"},
			wantErr: `model "team-a/chat-0", not "team-b/chat-0"`},
		{name: "signed by a Mac", ticket: mustSign(t, claims, mac), now: t0, ask: mine, wantErr: "signed by macfleet://node/mac-2, not a gateway"},
		{name: "signed by another fleet's gateway", ticket: mustSign(t, claims, foreignGW), now: t0, ask: mine, wantErr: "not from the fleet CA"},
		{name: "tampered digest", ticket: tamper(t, good, func(s *StateTicket) { s.Digest = "ffffffffffffffff" }), now: t0,
			ask: ask{"mac-2", "mac-1", "team-a/chat-0", "ffffffffffffffff"}, wantErr: "signature by macfleet://gateway/gw-1 does not hold"},
		{name: "tampered target", ticket: tamper(t, good, func(s *StateTicket) { s.Target = "mac-3" }), now: t0,
			ask: ask{"mac-3", "mac-1", "team-a/chat-0", "00112233aabbccdd"}, wantErr: "does not hold"},
		{name: "tampered expiry", ticket: tamper(t, good, func(s *StateTicket) { s.Expires = t0.Add(29 * time.Second) }),
			now: t0.Add(25 * time.Second), ask: mine, wantErr: "does not hold"},
		{name: "not base64", ticket: "!!", now: t0, ask: mine, wantErr: "not base64url"},
		{name: "none", ticket: "", now: t0, ask: mine, wantErr: "no state ticket"},
		{name: "too long", ticket: strings.Repeat("A", maxTicketBytes+1), now: t0, ask: mine, wantErr: "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := VerifyTicket(tc.ticket, roots, tc.now)
			if err == nil {
				err = got.Grants(tc.ask.target, tc.ask.source, tc.ask.model, tc.ask.digest)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if d := cmp.Diff(claims.Partition, got.Partition); d != "" {
					t.Errorf("partition (-want +got):\n%s", d)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestSignTicketBoundsItsLifetime: a gateway cannot sign a ticket that lives longer
// than MaxTicketLifetime, and a verifier refuses one that claims to.
func TestSignTicketBoundsItsLifetime(t *testing.T) {
	ca := mustCA(t, t0)
	gw := mustTLSCert(t, ca, Gateway("gw-1"), t0)
	long := StateTicket{Target: "a", Source: "b", Model: "m", Digest: "d", Issued: t0, Expires: t0.Add(MaxTicketLifetime + time.Second)}
	if _, err := SignTicket(long, gw); err == nil || !strings.Contains(err.Error(), "lifetime") {
		t.Fatalf("signing a 31 s ticket: %v, want a lifetime error", err)
	}
	ok := mustSign(t, StateTicket{Target: "a", Source: "b", Model: "m", Digest: "d", Issued: t0, Expires: t0.Add(MaxTicketLifetime)}, gw)
	stretched := signUnchecked(t, StateTicket{Target: "a", Source: "b", Model: "m", Digest: "d", Issued: t0, Expires: t0.Add(time.Hour)}, gw)
	if _, err := VerifyTicket(stretched, Pool([]*x509.Certificate{ca.Cert}), t0.Add(time.Minute)); err == nil || !strings.Contains(err.Error(), "lifetime") {
		t.Fatalf("a ticket claiming an hour: %v, want a lifetime error", err)
	}
	got, err := TicketClaims(ok)
	if err != nil || got.Source != "b" {
		t.Fatalf("TicketClaims = %+v, %v; want source b", got, err)
	}
}
