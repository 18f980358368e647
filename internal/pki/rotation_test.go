package pki

import (
	"crypto/x509"
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	cur := mustCA(t, t0)
	next := mustCA(t, t0.Add(244*24*time.Hour))
	renew := RenewAt(cur.Cert)
	prop := DefaultPropagation
	for _, tc := range []struct {
		name string
		r    Rotation
		now  time.Time
		want Step
	}{
		{name: "no CA", r: Rotation{}, now: t0, want: StepCreate},
		{name: "fresh CA", r: Rotation{Current: cur}, now: t0.Add(time.Hour), want: StepNone},
		{name: "just before two thirds", r: Rotation{Current: cur}, now: renew.Add(-time.Second), want: StepNone},
		{name: "two thirds", r: Rotation{Current: cur}, now: renew, want: StepPrepareNext},
		{name: "successor not yet published long enough", r: Rotation{Current: cur, Next: next}, now: published(next).Add(prop - time.Second), want: StepNone},
		{name: "successor published long enough", r: Rotation{Current: cur, Next: next}, now: published(next).Add(prop), want: StepPromote},
		{name: "previous still valid", r: Rotation{Current: next, Previous: cur.Cert}, now: cur.Cert.NotAfter.Add(-time.Second), want: StepNone},
		{name: "previous expired", r: Rotation{Current: next, Previous: cur.Cert}, now: cur.Cert.NotAfter, want: StepDropPrevious},
		{name: "current expired without successor", r: Rotation{Current: cur}, now: cur.Cert.NotAfter.Add(time.Hour), want: StepPrepareNext},
	} {
		if got := Plan(tc.r, tc.now, prop); got != tc.want {
			t.Errorf("%s: Plan = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRotationKeepsLeavesTrusted walks a whole rotation: a leaf of the old CA stays
// trusted until the old CA expires, the successor is trusted before it signs, and
// NextCheck names every moment Plan changes its mind.
func TestRotationKeepsLeavesTrusted(t *testing.T) {
	prop := DefaultPropagation
	r, err := Apply(Rotation{}, StepCreate, t0, DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	old := r.Current
	oldLeaf := mustLeaf(t, old, Gateway("g"), t0)
	now := NextCheck(r, prop)
	if Plan(r, now, prop) != StepPrepareNext || Plan(r, now.Add(-time.Second), prop) != StepNone {
		t.Fatalf("NextCheck %v is not when the successor is due", now)
	}
	if r, err = Apply(r, StepPrepareNext, now, DefaultCALifetime); err != nil {
		t.Fatal(err)
	}
	if n := len(r.Bundle()); n != 2 {
		t.Fatalf("bundle with a successor has %d CAs, want 2", n)
	}
	// The successor is trusted (its leaves verify) before it signs.
	newLeaf := mustLeaf(t, r.Next, Gateway("g"), now)
	if _, err := Verify([]*x509.Certificate{newLeaf}, Pool(r.Bundle()), now, x509.ExtKeyUsageClientAuth); err != nil {
		t.Fatalf("a successor's leaf before promotion: %v", err)
	}
	now = NextCheck(r, prop)
	if Plan(r, now, prop) != StepPromote {
		t.Fatalf("at %v Plan = %q, want Promote", now, Plan(r, now, prop))
	}
	if r, err = Apply(r, StepPromote, now, DefaultCALifetime); err != nil {
		t.Fatal(err)
	}
	if r.Current != nil && r.Current.Cert.Equal(old.Cert) || !r.Previous.Equal(old.Cert) {
		t.Fatal("after Promote the successor must sign and the old CA be the previous one")
	}
	// An old leaf renewed just before promotion stays trusted.
	late := mustLeaf(t, old, Gateway("g"), now.Add(-time.Minute))
	if _, err := Verify([]*x509.Certificate{late}, Pool(r.Bundle()), now.Add(time.Hour), x509.ExtKeyUsageClientAuth); err != nil {
		t.Fatalf("the old CA's leaf after promotion: %v", err)
	}
	now = NextCheck(r, prop)
	if !now.Equal(old.Cert.NotAfter) || Plan(r, now, prop) != StepDropPrevious {
		t.Fatalf("NextCheck %v, Plan %q; want DropPrevious at the old CA's expiry %v", now, Plan(r, now, prop), old.Cert.NotAfter)
	}
	if r, err = Apply(r, StepDropPrevious, now, DefaultCALifetime); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify([]*x509.Certificate{oldLeaf}, Pool(r.Bundle()), t0.Add(time.Hour), x509.ExtKeyUsageClientAuth); err == nil {
		t.Fatal("a leaf of the dropped CA still verifies")
	}
}
