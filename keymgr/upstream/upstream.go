// Package upstream is how meshca renews its signing intermediate: meshca
// holds a short-lived intermediate CA whose key never leaves it, signs
// every leaf with it in process, and asks an upstream authority to sign
// the next intermediate well before the current one expires. The
// long-lived root key stays with the upstream: in meshca's own CA state
// (self), in a PKCS#11 token, in Vault Transit, or behind a Vault PKI
// issuer. Each upstream lives in a sub-package and passes the contract
// suite in upstreamtest.
//
// An upstream signs what it is asked: which intermediate to renew, when,
// and whether its answer may be used are decided by meshca (Check holds
// every answer to the same rules, whatever the upstream).
package upstream

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Upstream signs meshca's intermediate CA certificates.
type Upstream interface {
	// SignIntermediate signs req.CSR's key as a CA certificate under
	// req.Root. It honours ctx's deadline. A failure is an *Error.
	SignIntermediate(ctx context.Context, req *Request) (*Response, error)
}

// Request asks for one intermediate.
type Request struct {
	// CSR carries the intermediate's public key, and is signed with the
	// intermediate's private key, which meshca generated and keeps.
	CSR *x509.CertificateRequest
	// Subject is the intermediate's subject, which meshca chooses; an
	// upstream that cannot set it (a Vault PKI issuer takes the CSR's)
	// gets it in the CSR too.
	Subject pkix.Name
	// TrustDomain is the mesh's: the intermediate's one URI SAN is its
	// SPIFFE ID (spiffe://<trust domain>), as SPIRE gives its CAs, and
	// the CSR carries it too.
	TrustDomain spiffeid.TrustDomain
	// Root is the root the intermediate must chain to, and Ref where its
	// key is, as the CA state records them.
	Root *x509.Certificate
	Ref  Ref
	// RootKey is the root's private key when the CA state holds it (the
	// self upstream); nil for every other upstream, whose keys never
	// leave them.
	RootKey crypto.Signer
	// TTL is the intermediate's lifetime: NotAfter is TTL from now, and an
	// answer that ends later, or more than a clock's slack earlier, is
	// refused by Check.
	TTL time.Duration
}

// Response is a signed intermediate.
type Response struct {
	// Cert is the intermediate.
	Cert *x509.Certificate
	// Chain are the certificates between Cert and Root, nearest first,
	// without Root: empty when Root signed Cert itself.
	Chain []*x509.Certificate
}

// Ref names a root key where its upstream keeps it, as the CA state
// records it beside the root certificate.
type Ref struct {
	// Type is the upstream's name: "self", "pkcs11", "vault-transit" or
	// "vault-pki".
	Type string `json:"type"`
	// Key is the upstream's own name for the key: a PKCS#11 object's
	// label and ID, a Transit key's name and version, a Vault issuer's
	// ID. Empty for self, whose key is in the CA state.
	Key string `json:"key,omitempty"`
}

// RootMaker is an upstream that makes the root of a new lineage for
// `meshca root prepare`: a new key where the upstream keeps keys (a new
// object in the token, a new Transit key, a new Vault issuer), and its
// self-signed certificate.
type RootMaker interface {
	NewRoot(ctx context.Context, req *RootRequest) (*Root, error)
}

// RootRequest describes a new root.
type RootRequest struct {
	KeyType certs.KeyType
	Subject pkix.Name
	TTL     time.Duration
	Now     time.Time
}

// Root is a new root.
type Root struct {
	Cert *x509.Certificate
	Ref  Ref
	// Key is the root's private key when the CA state must keep it (the
	// self upstream); nil for every other upstream.
	Key crypto.Signer
	// Adopted: the key existed before NewRoot (an operator named it), so
	// meshca never destroys it, even when the root is never recorded.
	Adopted bool
}

// KeyDestroyer is an upstream that can destroy a root key it keeps, for
// `meshca root retire --destroy-root-key` and for a root that NewRoot
// made but that was never recorded (an orphan). It destroys only a key
// meshca made and named, and that is root's.
type KeyDestroyer interface {
	// CheckDestroy reports, destroying nothing, whether DestroyRoot
	// would destroy the key ref names: nil, or an *Error (KindRefused
	// when the upstream forbids it) that says why not and what to do.
	CheckDestroy(ctx context.Context, root *x509.Certificate, ref Ref) error
	// DestroyRoot destroys the key ref names, root's, in the upstream.
	DestroyRoot(ctx context.Context, root *x509.Certificate, ref Ref) error
}

// Roots is an upstream whose trust bundle is its own (Vault PKI: the
// roots of its issuers); the others' roots are the CA state's.
type Roots interface {
	Roots(ctx context.Context) ([]*x509.Certificate, error)
}

// Kind classifies an upstream failure for the renewer's retry decision.
type Kind string

// Kinds of upstream failure.
const (
	// KindUnavailable: the upstream is down, sealed, unreachable or timed
	// out; retry with backoff.
	KindUnavailable Kind = "unavailable"
	// KindRefused: the upstream refuses the request (a policy, a missing
	// permission, a key it does not hold); retrying will not help until an
	// operator acts, but the renewer keeps trying, more slowly.
	KindRefused Kind = "refused"
	// KindInternal: anything else, including an answer that breaks Check.
	KindInternal Kind = "internal"
)

// Error is an upstream failure.
type Error struct {
	Upstream string
	Kind     Kind
	Err      error
}

func (e *Error) Error() string {
	return "upstream " + e.Upstream + ": " + string(e.Kind) + ": " + e.Err.Error()
}
func (e *Error) Unwrap() error { return e.Err }

// KindOf is err's Kind: an *Error's, KindUnavailable for a context that
// ended, KindInternal otherwise.
func KindOf(err error) Kind {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Kind
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return KindUnavailable
	}
	return KindInternal
}
