package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A state ticket is a gateway's permission for one Mac to fetch one prompt cache
// state from another Mac's agent (peer fetch, api/runnerapi/peerstate.go): it names
// the fetching Mac (Target), the Mac that serves the state (Source), the model's id
// on the source agent, the prefix digest and the cache partition, and expires within
// MaxTicketLifetime. The gateway signs it with the key of its own fleet certificate
// and carries that certificate's chain in it, so the source agent checks it against
// the fleet CA bundle it already trusts, and that the signer is a gateway, without
// asking anyone.
//
// On the wire a ticket is base64url (no padding) of a JSON envelope: the claims as
// signed bytes, the chain (DER, leaf first) and an ECDSA signature over SHA-256 of
// ticketContext followed by the claims.

// MaxTicketLifetime bounds a ticket's lifetime (Expires − Issued).
const MaxTicketLifetime = 30 * time.Second

// maxTicketBytes bounds an encoded ticket (a chain of one or two certificates is
// about 1.5 KiB).
const maxTicketBytes = 16 << 10

// ticketContext separates the ticket's signatures from any other use of the key.
const ticketContext = "macfleet state ticket v1\n"

// StateTicket is what a ticket grants.
type StateTicket struct {
	// Target is the MacNode name of the Mac that may fetch; Source that of the Mac
	// whose agent serves the state.
	Target string `json:"target"`
	Source string `json:"source"`
	// Model is the model's id on the source agent (its pool entry).
	Model string `json:"model"`
	// Digest is the prefix digest of the state.
	Digest string `json:"digest"`
	// Partition is the cache partition the state is looked up in ("" the shared one).
	Partition string    `json:"partition,omitempty"`
	Issued    time.Time `json:"iat"`
	Expires   time.Time `json:"exp"`
}

type ticketEnvelope struct {
	Claims []byte   `json:"c"`
	Chain  [][]byte `json:"x"`
	Sig    []byte   `json:"s"`
}

// SignTicket encodes t signed with cert's key (ECDSA), carrying cert's chain.
func SignTicket(t StateTicket, cert *tls.Certificate) (string, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return "", errors.New("signing a state ticket: no certificate")
	}
	key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return "", fmt.Errorf("signing a state ticket: the key is a %T, not ECDSA", cert.PrivateKey)
	}
	if d := t.Expires.Sub(t.Issued); d <= 0 || d > MaxTicketLifetime {
		return "", fmt.Errorf("signing a state ticket: its lifetime %v is not within (0, %v]", d, MaxTicketLifetime)
	}
	claims, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	sum := ticketDigest(claims)
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("signing a state ticket: %w", err)
	}
	b, err := json.Marshal(ticketEnvelope{Claims: claims, Chain: cert.Certificate, Sig: sig})
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func ticketDigest(claims []byte) [sha256.Size]byte {
	return sha256.Sum256(append([]byte(ticketContext), claims...))
}

// decodeTicket reads an encoded ticket's envelope and claims without checking them.
func decodeTicket(s string) (ticketEnvelope, StateTicket, error) {
	var env ticketEnvelope
	var t StateTicket
	if len(s) == 0 {
		return env, t, errors.New("no state ticket")
	}
	if len(s) > maxTicketBytes {
		return env, t, fmt.Errorf("the state ticket is %d bytes, over %d", len(s), maxTicketBytes)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return env, t, fmt.Errorf("the state ticket is not base64url: %w", err)
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return env, t, fmt.Errorf("the state ticket is not a ticket: %w", err)
	}
	if err := json.Unmarshal(env.Claims, &t); err != nil {
		return env, t, fmt.Errorf("the state ticket's claims: %w", err)
	}
	return env, t, nil
}

// TicketClaims reads what a ticket claims WITHOUT checking it: for the fetching agent,
// which took the ticket from a gateway and needs only to know which Mac to call (the
// source agent checks it).
func TicketClaims(s string) (StateTicket, error) {
	_, t, err := decodeTicket(s)
	return t, err
}

// VerifyTicket checks an encoded ticket at now: its chain is from the fleet CA
// (roots) and names a gateway, its signature holds over its claims, and now lies
// within its lifetime, which is at most MaxTicketLifetime. It returns the claims;
// whether they grant a request is StateTicket.Grants.
func VerifyTicket(s string, roots *x509.CertPool, now time.Time) (StateTicket, error) {
	env, t, err := decodeTicket(s)
	if err != nil {
		return StateTicket{}, err
	}
	chain := make([]*x509.Certificate, 0, len(env.Chain))
	for _, der := range env.Chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return StateTicket{}, fmt.Errorf("the state ticket's certificate: %w", err)
		}
		chain = append(chain, c)
	}
	id, err := Verify(chain, roots, now, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return StateTicket{}, fmt.Errorf("the state ticket's signer: %w", err)
	}
	if id.Kind != KindGateway {
		return StateTicket{}, fmt.Errorf("the state ticket is signed by %s, not a gateway", id)
	}
	pub, ok := chain[0].PublicKey.(*ecdsa.PublicKey)
	sum := ticketDigest(env.Claims)
	if !ok || !ecdsa.VerifyASN1(pub, sum[:], env.Sig) {
		return StateTicket{}, fmt.Errorf("the state ticket's signature by %s does not hold", id)
	}
	switch life := t.Expires.Sub(t.Issued); {
	case life <= 0 || life > MaxTicketLifetime:
		return StateTicket{}, fmt.Errorf("the state ticket's lifetime %v is not within (0, %v]", life, MaxTicketLifetime)
	case now.Before(t.Issued.Add(-backdate)):
		return StateTicket{}, fmt.Errorf("the state ticket is issued at %v, in the future", t.Issued.UTC())
	case !now.Before(t.Expires):
		return StateTicket{}, fmt.Errorf("the state ticket expired at %v", t.Expires.UTC())
	}
	return t, nil
}

// Grants says why t does not let Mac target fetch digest of model from Mac source,
// or nil.
func (t StateTicket) Grants(target, source, model, digest string) error {
	switch {
	case t.Target != target:
		return fmt.Errorf("the state ticket is for Mac %q, not %q", t.Target, target)
	case t.Source != source:
		return fmt.Errorf("the state ticket is for fetching from Mac %q, not %q", t.Source, source)
	case t.Model != model:
		return fmt.Errorf("the state ticket is for model %q, not %q", t.Model, model)
	case t.Digest != digest:
		return fmt.Errorf("the state ticket is for digest %q, not %q", t.Digest, digest)
	}
	return nil
}
