package upstream

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// KeySigned is an upstream that holds the root key and signs with it
// through a crypto.Signer, while meshca builds the certificates: its own
// root in the CA state (self), a key in a PKCS#11 token, a Vault Transit
// key. Such upstreams differ only in where the key is; the certificates
// are built here, once, for all of them.
type KeySigned struct {
	// Name is the upstream's: Ref.Type, and what errors name.
	Name string
	// Key returns the signer of the root key req names (req.Ref, or
	// req.RootKey when the CA state holds it), bound to ctx when it signs
	// remotely. A key the upstream does not hold is an *Error of
	// KindRefused; one it cannot reach now, of KindUnavailable.
	Key func(ctx context.Context, req *Request) (crypto.Signer, error)
	// NewKey makes a new root key of type kt where the upstream keeps
	// keys, for NewRoot: its signer and its Ref. label names it, for
	// upstreams that label keys.
	NewKey func(ctx context.Context, kt certs.KeyType, label string) (crypto.Signer, Ref, error)
	// Destroy, when set, destroys a key NewKey made, for a NewRoot that
	// fails after making it: the key would be left in the upstream,
	// recorded nowhere. When it is nil or fails, NewRoot's error names
	// the key, for an operator to delete.
	Destroy func(ctx context.Context, ref Ref) error
	// KeepKey: the CA state keeps the root key (Root.Key is the signer
	// NewKey returned); the key of every other upstream stays where it is.
	KeepKey bool
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// SignIntermediate implements Upstream: it builds req's intermediate and
// has the root key sign it. It checks the CSR's signature, that the key
// is the root's, and refuses an intermediate that would outlive its root
// rather than cut it short.
func (k *KeySigned) SignIntermediate(ctx context.Context, req *Request) (*Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, k.fail(KindUnavailable, err)
	}
	now := k.now()
	tmpl, err := k.intermediate(req, now)
	if err != nil {
		return nil, err
	}
	key, err := k.Key(ctx, req)
	if err != nil {
		return nil, k.wrap(ctx, KindRefused, err)
	}
	if !csr.SamePublicKey(key.Public(), req.Root.PublicKey) {
		return nil, k.fail(KindRefused, fmt.Errorf("the key %s names is not the key of root %q", describe(req.Ref), req.Root.Subject))
	}
	cert, err := create(tmpl, req.Root, req.CSR.PublicKey, key)
	if err != nil {
		return nil, k.wrap(ctx, KindInternal, err)
	}
	return &Response{Cert: cert}, nil
}

// intermediate is the template of req's intermediate at now.
func (k *KeySigned) intermediate(req *Request, now time.Time) (*x509.Certificate, error) {
	switch {
	case req.CSR == nil || req.Root == nil:
		return nil, k.fail(KindInternal, errors.New("the request has no CSR or no root"))
	case req.TTL <= 0:
		return nil, k.fail(KindInternal, fmt.Errorf("lifetime %v is not positive", req.TTL))
	case req.TrustDomain.IsZero():
		return nil, k.fail(KindInternal, errors.New("the request names no trust domain"))
	}
	if err := req.CSR.CheckSignature(); err != nil {
		return nil, k.fail(KindRefused, fmt.Errorf("the CSR's signature: %w", err))
	}
	notAfter := now.Add(req.TTL).Truncate(time.Second)
	if notAfter.After(req.Root.NotAfter) {
		return nil, k.fail(KindRefused, fmt.Errorf("an intermediate ending at %s would outlive its root %q (%s)",
			notAfter.UTC().Format(time.RFC3339), req.Root.Subject, req.Root.NotAfter.UTC().Format(time.RFC3339)))
	}
	tmpl, err := caTemplate(req.CSR.PublicKey, req.Subject, now, notAfter)
	if err != nil {
		return nil, k.fail(KindInternal, err)
	}
	if tmpl.NotBefore.Before(req.Root.NotBefore) {
		tmpl.NotBefore = req.Root.NotBefore
	}
	tmpl.MaxPathLen, tmpl.MaxPathLenZero = 0, true
	tmpl.URIs = []*url.URL{req.TrustDomain.ID().URL()}
	if tmpl.AuthorityKeyId = req.Root.SubjectKeyId; len(tmpl.AuthorityKeyId) == 0 {
		if tmpl.AuthorityKeyId, err = certs.SubjectKeyID(req.Root.PublicKey); err != nil {
			return nil, k.fail(KindInternal, err)
		}
	}
	return tmpl, nil
}

// NewRoot implements RootMaker: a new key where the upstream keeps keys
// (NewKey), and its self-signed root certificate.
func (k *KeySigned) NewRoot(ctx context.Context, req *RootRequest) (*Root, error) {
	if err := ctx.Err(); err != nil {
		return nil, k.fail(KindUnavailable, err)
	}
	if k.NewKey == nil {
		return nil, k.fail(KindRefused, errors.New("this upstream makes no root keys"))
	}
	now := req.Now
	if now.IsZero() {
		now = k.now()
	}
	if req.TTL <= 0 {
		return nil, k.fail(KindInternal, fmt.Errorf("lifetime %v is not positive", req.TTL))
	}
	key, ref, err := k.NewKey(ctx, req.KeyType, req.Subject.CommonName)
	if err != nil {
		return nil, k.wrap(ctx, KindRefused, err)
	}
	tmpl, err := caTemplate(key.Public(), req.Subject, now, now.Add(req.TTL).Truncate(time.Second))
	if err != nil {
		return nil, k.orphan(ctx, ref, k.fail(KindInternal, err))
	}
	cert, err := create(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, k.orphan(ctx, ref, k.wrap(ctx, KindInternal, err))
	}
	r := &Root{Cert: cert, Ref: ref}
	if k.KeepKey {
		r.Key = key
	}
	return r, nil
}

// orphan is the error of a NewRoot that failed after NewKey made ref's
// key: the key is destroyed (Destroy), or the error names it, so that an
// operator can delete it. The key of a KeepKey upstream dies with the
// process.
func (k *KeySigned) orphan(ctx context.Context, ref Ref, err error) error {
	if k.KeepKey {
		return err
	}
	e := &Error{Upstream: k.Name, Kind: KindOf(err), Err: err}
	if errors.As(err, &e) {
		e = &Error{Upstream: e.Upstream, Kind: e.Kind, Err: e.Err}
	}
	if k.Destroy == nil {
		e.Err = fmt.Errorf("%w; the new key %s is left in the upstream, recorded nowhere: delete it", e.Err, describe(ref))
		return e
	}
	// The request's context may be what ended; the cleanup gets its own.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), OrphanTimeout)
	defer cancel()
	if derr := k.Destroy(dctx, ref); derr != nil {
		e.Err = fmt.Errorf("%w; the new key %s is left in the upstream, recorded nowhere, and destroying it failed (%v): delete it", e.Err, describe(ref), derr)
		return e
	}
	e.Err = fmt.Errorf("%w; the new key %s was destroyed", e.Err, describe(ref))
	return e
}

// OrphanTimeout bounds the destruction of a key a failed step left.
const OrphanTimeout = 30 * time.Second

// caTemplate is what every CA certificate meshca builds starts with.
func caTemplate(pub crypto.PublicKey, subject pkix.Name, now, notAfter time.Time) (*x509.Certificate, error) {
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, err
	}
	skid, err := certs.SubjectKeyID(pub)
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             now.Add(-certs.Backdate).Truncate(time.Second),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          skid,
	}, nil
}

// create signs tmpl under parent with key and parses the result.
func create(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return x509.ParseCertificate(der)
}

// NewCSR is the request for an intermediate of key: subject, and the
// trust domain's SPIFFE ID as its one URI name.
func NewCSR(key crypto.Signer, subject pkix.Name, td spiffeid.TrustDomain) (*x509.CertificateRequest, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject, URIs: []*url.URL{td.ID().URL()}}, key)
	if err != nil {
		return nil, fmt.Errorf("upstream: intermediate CSR: %w", err)
	}
	return x509.ParseCertificateRequest(der)
}

func (k *KeySigned) now() time.Time {
	if k.Now == nil {
		return time.Now()
	}
	return k.Now()
}

func (k *KeySigned) fail(kind Kind, err error) *Error {
	return &Error{Upstream: k.Name, Kind: kind, Err: err}
}

// wrap is err as an *Error: err's own when it is one, KindUnavailable
// when ctx ended, else kind.
func (k *KeySigned) wrap(ctx context.Context, kind Kind, err error) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return err
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return k.fail(KindUnavailable, err)
	}
	return k.fail(kind, err)
}

// describe names a Ref in messages.
func describe(r Ref) string {
	if r.Key == "" {
		return r.Type
	}
	return r.Type + " " + r.Key
}
