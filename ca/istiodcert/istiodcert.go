// Package istiodcert keeps istiod's serving certificate: the Secret that
// istiod's chart mounts at /var/run/secrets/istiod/tls (istiod-tls), with
// tls.crt (the leaf and its intermediates), tls.key and ca.crt (every
// root of the trust bundle). ztunnel and istio-agent verify istiod's xDS
// certificate against the same roots they verify the CA with, so the mesh
// works only if istiod's certificate chains to the bundle meshca
// publishes, through every step of a root rotation.
//
// A Keeper issues it through the CA's own path (the Issuer, which ca
// implements: key policy, signer, chain verification, audit) and rewrites
// it when its roots change (prepare, retire), when another authority
// signs (activate), when its names change, and at two thirds of its life.
// Read gives the rotation guards what the Secret holds
// (keymgr.Dependent).
package istiodcert

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The keys of the Secret, as istiod's chart mounts it and cert-manager
// writes a kubernetes.io/tls Secret.
const (
	KeyCert  = corev1.TLSCertKey       // tls.crt: the leaf, then its intermediates
	KeyKey   = corev1.TLSPrivateKeyKey // tls.key: the leaf's private key, PKCS #8
	KeyRoots = "ca.crt"                // every root of the trust bundle
)

// AnnotationIssuedUnder records the SHA-256 fingerprint of the
// certificate that signed for the CA when the keeper last issued: a
// change of it (activate) reissues the leaf, whatever the backend
// answered with.
const AnnotationIssuedUnder = "meshca.io/issued-under"

// Issuer issues istiod's certificate; ca's DNSIssuer is the one
// implementation, so that it passes the same key policy, backend, chain
// verification and audit as a workload's.
type Issuer interface {
	IssueDNS(ctx context.Context, r *IssueRequest) (*Issued, error)
}

// IssueRequest is what IssueDNS signs.
type IssueRequest struct {
	// Secret is namespace/name, for the audit.
	Secret string
	// CSR is a PEM PKCS #10 request for exactly DNSNames.
	CSR      []byte
	DNSNames []string
	TTL      time.Duration
}

// Issued is a verified certificate.
type Issued struct {
	Leaf *x509.Certificate
	// Intermediates are those between Leaf and a root, nearest first.
	Intermediates []*x509.Certificate
	// Roots is the trust bundle Leaf was verified to: what ca.crt holds.
	Roots []*x509.Certificate
}

// Held is what the Secret holds, parsed.
type Held struct {
	// Chain is tls.crt, leaf first; Roots is ca.crt.
	Chain []*x509.Certificate
	Roots []*x509.Certificate
	// KeyMatches says tls.key is the private key of Chain[0].
	KeyMatches bool
	// IssuedUnder is AnnotationIssuedUnder; Deployment is
	// AnnotationDeployment.
	IssuedUnder, Deployment string
}

// Leaf is the certificate istiod serves; nil when there is none.
func (h *Held) Leaf() *x509.Certificate {
	if h == nil || len(h.Chain) == 0 {
		return nil
	}
	return h.Chain[0]
}

// RenewAt is when a leaf is renewed whatever else happens: two thirds of
// its life.
func RenewAt(leaf *x509.Certificate) time.Time {
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
}

// Parse reads s; a Secret whose tls.crt or tls.key is missing or
// unreadable holds no chain.
func Parse(s *corev1.Secret) *Held {
	h := &Held{IssuedUnder: s.Annotations[AnnotationIssuedUnder], Deployment: s.Annotations[AnnotationDeployment]}
	h.Roots, _ = pemutil.ParseCertificates(s.Data[KeyRoots])
	chain, err := pemutil.ParseCertificates(s.Data[KeyCert])
	if err != nil || len(chain) == 0 {
		return h
	}
	h.Chain = chain
	if key, err := pemutil.ParsePrivateKey(s.Data[KeyKey]); err == nil {
		h.KeyMatches = csr.SamePublicKey(key.Public(), chain[0].PublicKey)
	}
	return h
}

// Dependent is h as the rotation guards see it, named name.
func (h *Held) Dependent(name string) keymgr.Dependent {
	d := keymgr.Dependent{Name: name, Chain: h.Chain, Roots: h.Roots}
	if leaf := h.Leaf(); leaf != nil {
		d.RenewAt = RenewAt(leaf)
	}
	return d
}

// DependentName names the Secret namespace/name in the guards' messages.
func DependentName(secret string) string {
	return fmt.Sprintf("istiod's certificate (Secret %s)", secret)
}

// Read returns what the Secret namespace/name holds for the rotation
// guards: no chain when it does not exist, the error in Err when it
// cannot be read; and, when the keeper restarts istiod's Deployment, the
// roots its Pods started with.
func Read(ctx context.Context, client kubernetes.Interface, namespace, name string) keymgr.Dependent {
	dn := DependentName(namespace + "/" + name)
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return keymgr.Dependent{Name: dn}
	case err != nil:
		return keymgr.Dependent{Name: dn, Err: err}
	}
	h := Parse(s)
	d := h.Dependent(dn)
	if h.Deployment != "" {
		readRestart(ctx, client, namespace, h.Deployment, &d)
	}
	return d
}
