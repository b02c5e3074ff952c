// Package signer defines how meshca asks a certificate authority backend to
// sign a workload certificate. Backends live in sub-packages (local, ...)
// and all pass the contract suite in signertest.
//
// A backend signs what it is told: authentication, authorization and CSR
// policy happen before Sign is called.
package signer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Signer signs workload certificates, and the DNS serving certificates of
// the control plane meshca keeps (istiod's).
type Signer interface {
	// Sign issues a certificate for req. It honours ctx's deadline.
	Sign(ctx context.Context, req *Request) (*Response, error)
}

// Request is a checked signing request.
//
// What a backend issues for it is fixed by meshca, never by the CSR or the
// backend's own configuration: an empty subject (a workload's identity is
// its URI SAN, whatever subject the CSR carries), the URI of ID as the only
// SAN (or exactly DNSNames, for a DNS request), exactly Usages, and
// NotAfter at most TTL from now. CheckIssued
// holds every backend's answer to these rules.
type Request struct {
	// CSR is the parsed request; its signature and policy are already
	// checked. Only its public key is used by the built-in CA; remote
	// backends forward CSR.Raw.
	CSR *x509.CertificateRequest
	// ID is the identity to certify: the certificate's only SAN. Zero
	// for a DNS request.
	ID spiffeid.ID
	// DNSNames, for a DNS request, are the certificate's only SANs, in
	// place of ID: the serving certificate of a control-plane component
	// (istiod's, for its xDS port), never a workload's. A backend issues
	// it under the role or profile its operator set aside for it, apart
	// from the workloads' own.
	DNSNames []string
	// TTL is the requested lifetime; NotAfter is also capped at the issuer's.
	TTL time.Duration
	// Lifetime, when set, is the validity the caller needs, NotAfter less
	// NotBefore, to the second, whatever the backend's backdate: a
	// PodCertificateRequest's certificate must live between one hour and
	// spec.maxExpirationSeconds, which may be one hour too. A backend that
	// can start and end a certificate where it wants (the built-in CA,
	// in-process cfssl) ends it Lifetime after its backdated start; Vault
	// asks its role for Lifetime less the role's not_before_duration. A
	// backend whose configuration fixes the lifetime (a remote cfssl
	// profile, an external Kubernetes signer behind k8scsr) cannot, and the
	// caller judges what it gets. NotAfter stays at most TTL from now,
	// so Lifetime is at most TTL plus the backdate.
	Lifetime time.Duration
	// Usages are exactly the key usages the certificate carries; the
	// caller derives them from the key (csr.WorkloadUsages).
	Usages csr.Usages
}

// DNS reports whether r is a DNS request (DNSNames) rather than a
// workload's.
func (r *Request) DNS() bool { return len(r.DNSNames) > 0 }

// Names renders what the request certifies, for messages: the SPIFFE ID,
// or the DNS names joined by commas.
func (r *Request) Names() string {
	if len(r.DNSNames) > 0 {
		return strings.Join(r.DNSNames, ",")
	}
	return r.ID.String()
}

// Response is an issued certificate and the intermediates between it and a
// root, nearest first, without any root.
type Response struct {
	Leaf          *x509.Certificate
	Intermediates []*x509.Certificate
	// VerifiedIssuer, when set, is the certificate whose key signed Leaf,
	// and says that the backend has verified Leaf's signature with that
	// certificate's public key itself: crypto/x509 does so for every
	// certificate it creates. The server then verifies the rest of the
	// chain to the trust bundle, but not that signature a second time.
	// Remote backends leave it nil: their answers are verified in full,
	// unless a wrapper checked the signature (keymgr.ExternalTrust.Judge
	// does, for a backend whose CA state meshca follows).
	VerifiedIssuer *x509.Certificate
}

// Kind classifies a backend failure for the caller's retry decision.
type Kind string

// Kinds of backend failure.
const (
	// KindUnavailable: the backend is down, sealed or timed out; retry.
	KindUnavailable Kind = "unavailable"
	// KindRefused: the backend's configuration refuses the request (a role
	// that forbids the name, say); retrying will not help until an operator
	// acts.
	KindRefused Kind = "refused"
	// KindInternal: anything else, including a backend answer that breaks
	// meshca's rules.
	KindInternal Kind = "internal"
)

// Error is a backend failure.
type Error struct {
	Backend string
	Kind    Kind
	Err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("signer %s: %s: %v", e.Backend, e.Kind, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error of the given kind.
func Errorf(backend string, kind Kind, format string, args ...any) error {
	return &Error{Backend: backend, Kind: kind, Err: fmt.Errorf(format, args...)}
}

// KindOf returns the kind of err: KindUnavailable for context expiry, the
// kind of an *Error, KindInternal otherwise.
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

// ExpiringError is a refusal to sign because the signing path ends too
// soon for a certificate worth issuing: an intermediate that expired, or
// is about to, while its renewal fails. It comes as the Err of an
// *Error of KindUnavailable: the client retries, and the CA's operator
// is told by readiness, metrics and alerts.
type ExpiringError struct {
	// End is when the signing path ends.
	End time.Time
	// Why says, in words safe for a client, why it was not renewed in
	// time (which upstream, failing since when); empty when not known.
	Why string
	// Err is the renewal's last failure, for the log; nil when not known.
	Err error
}

func (e *ExpiringError) Error() string {
	msg := "the signing certificate ends at " + e.End.UTC().Format(time.RFC3339) + ", too soon to issue a certificate"
	if e.Why != "" {
		msg += " (" + e.Why + ")"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *ExpiringError) Unwrap() error { return e.Err }

// MinLifetime is the shortest certificate worth issuing for a request of
// ttl: half of it, and never more than a minute. A signing path that
// ends sooner than that is refused with an ExpiringError rather than
// issue a certificate cut shorter, which its workload would renew again
// at once.
func MinLifetime(ttl time.Duration) time.Duration { return min(time.Minute, ttl/2) }
