// Package keypin binds a Mac's node identity to its TLS key, so that a copy of the
// Mac's node credential (its token) gets no certificate for a key of the thief's own.
//
// The first certificate the signer (controllers/certsigner) issues to a Mac after it
// is enrolled pins that Mac's public key: the SHA-256 of its SubjectPublicKeyInfo,
// kept in an annotation (PinAnnotation) of the Mac's binding Secret
// macfleet-nodes/<mac>-credential, which node identities may not write (RBAC grants
// them no Secrets and the node-restriction admission policy denies every write
// outside their own MacNode, Lease, replica status, Events, token and CSRs). Later
// requests are signed only for the pinned key, or for a new key when they carry a
// rotation proof (ProofAnnotation): a signature by the pinned key over the new one,
// which only the holder of the pinned key can make. Re-enrolling the Mac (`macfleet
// nodes credentials`, `macfleet nodes revoke`) clears the pin: the next request pins
// again.
//
// Decide is the whole decision, with no I/O; the signer reads the pin and writes the
// new one.
package keypin

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

const (
	// PinAnnotation, on a Mac's binding Secret, is the fingerprint (Fingerprint) of
	// the key its certificates are issued for.
	PinAnnotation = "macfleet.dev/node-key-sha256"
	// ProofAnnotation, on a CertificateSigningRequest, proves that its requester
	// holds the key it replaces: "<previous SPKI>.<signature>", both unpadded
	// base64url; the signature is by the previous (ECDSA) key over ProofMessage.
	ProofAnnotation = "macfleet.dev/key-rotation-proof"
)

// Fingerprint is the pin of a public key: "sha256:" and the hex SHA-256 of its
// DER SubjectPublicKeyInfo.
func Fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("encoding the public key: %w", err)
	}
	return fingerprintDER(der), nil
}

func fingerprintDER(der []byte) string {
	sum := sha256.Sum256(der)
	return fmt.Sprintf("sha256:%x", sum)
}

// ProofMessage is what a rotation proof signs: the Mac it is for and the new key, so
// that a proof is good for that Mac and that key only.
func ProofMessage(node string, newPub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(newPub)
	if err != nil {
		return nil, fmt.Errorf("encoding the new public key: %w", err)
	}
	msg := append([]byte("macfleet node key rotation\x00"+node+"\x00"), der...)
	sum := sha256.Sum256(msg)
	return sum[:], nil
}

// Prove signs, with the Mac's previous key, that newPub is its next key; the result
// is the value of ProofAnnotation.
func Prove(previous *ecdsa.PrivateKey, node string, newPub crypto.PublicKey) (string, error) {
	digest, err := ProofMessage(node, newPub)
	if err != nil {
		return "", err
	}
	sig, err := ecdsa.SignASN1(rand.Reader, previous, digest)
	if err != nil {
		return "", fmt.Errorf("signing the key-rotation proof: %w", err)
	}
	prev, err := x509.MarshalPKIXPublicKey(previous.Public())
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(prev) + "." + enc.EncodeToString(sig), nil
}

// verify checks a rotation proof for node's newPub and returns the fingerprint of
// the previous key that signed it.
func verify(proof, node string, newPub crypto.PublicKey) (string, error) {
	prevB64, sigB64, ok := strings.Cut(proof, ".")
	enc := base64.RawURLEncoding
	prevDER, err1 := enc.DecodeString(prevB64)
	sig, err2 := enc.DecodeString(sigB64)
	if !ok || err1 != nil || err2 != nil {
		return "", errors.New("it is not <previous key>.<signature> in unpadded base64url")
	}
	prev, err := x509.ParsePKIXPublicKey(prevDER)
	if err != nil {
		return "", fmt.Errorf("its previous key: %w", err)
	}
	ec, isEC := prev.(*ecdsa.PublicKey)
	if !isEC {
		return "", fmt.Errorf("its previous key is a %T, not ECDSA", prev)
	}
	digest, err := ProofMessage(node, newPub)
	if err != nil {
		return "", err
	}
	if !ecdsa.VerifyASN1(ec, digest, sig) {
		return "", fmt.Errorf("its signature does not verify with its previous key over node %s's new key", node)
	}
	return fingerprintDER(prevDER), nil
}

// Request is what Decide reads of one certificate request and its Mac.
type Request struct {
	// Node is the Mac the request is for (its requester's identity).
	Node string
	// Key is the public key the request asks a certificate for.
	Key crypto.PublicKey
	// Proof is the request's ProofAnnotation, empty when it has none.
	Proof string
	// Enrolled: the Mac's binding Secret exists (the pin's home).
	Enrolled bool
	// Pin is the binding Secret's PinAnnotation, empty when no key is pinned yet.
	Pin string
}

// Decision is whether a request may be signed, and the pin after signing it.
type Decision struct {
	// Sign: the request's key is the Mac's.
	Sign bool
	// Pin is the pin to hold once the certificate is issued; it differs from
	// Request.Pin when this request pins a first key or rotates to a new one.
	Pin string
	// Why says what was decided; for a refusal, why and the fix.
	Why string
}

// Decide says whether req's key may get node req.Node's certificate: the first
// key after enrolment is pinned; then only the pinned key, or a new one whose proof
// is signed by the pinned key.
func Decide(req Request) Decision {
	reenrol := fmt.Sprintf("if the Mac lost its key (its agent's state directory was wiped), re-enrol it with "+
		"`macfleet nodes credentials %[1]s`, which clears the pin; if its credential may have been copied, "+
		"`macfleet nodes revoke %[1]s` first", req.Node)
	if !req.Enrolled {
		return Decision{Why: fmt.Sprintf("node %[1]s has no binding Secret macfleet-nodes/%[1]s-credential to pin its key on: "+
			"issue its credential with `macfleet nodes credentials %[1]s`", req.Node)}
	}
	fp, err := Fingerprint(req.Key)
	if err != nil {
		return Decision{Pin: req.Pin, Why: "the request's key: " + err.Error()}
	}
	switch {
	case req.Pin == "":
		return Decision{Sign: true, Pin: fp, Why: fmt.Sprintf("the first key of node %s since it was enrolled, now pinned (%s)", req.Node, fp)}
	case fp == req.Pin:
		return Decision{Sign: true, Pin: req.Pin, Why: fmt.Sprintf("node %s's pinned key (%s)", req.Node, fp)}
	case req.Proof == "":
		return Decision{Pin: req.Pin, Why: fmt.Sprintf("the request's key %s is not node %s's pinned key %s, and the request "+
			"carries no %s signed by the pinned key: only the Mac holding that key gets certificates; %s",
			fp, req.Node, req.Pin, ProofAnnotation, reenrol)}
	}
	prev, err := verify(req.Proof, req.Node, req.Key)
	if err != nil {
		return Decision{Pin: req.Pin, Why: fmt.Sprintf("the request's %s: %v; %s", ProofAnnotation, err, reenrol)}
	}
	if prev != req.Pin {
		return Decision{Pin: req.Pin, Why: fmt.Sprintf("the request's %s is signed by key %s, not node %s's pinned key %s; %s",
			ProofAnnotation, prev, req.Node, req.Pin, reenrol)}
	}
	return Decision{Sign: true, Pin: fp, Why: fmt.Sprintf("node %s rotates from its pinned key %s to %s, proven by the pinned key", req.Node, prev, fp)}
}
