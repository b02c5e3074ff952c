// Package vaultpki is the vault-pki upstream: a Vault PKI issuer signs
// meshca's intermediate (<mount>/issuer/<id>/sign-intermediate), its key
// never leaving Vault, and the roots are Vault's (Roots: the mount's
// self-signed issuers). NewRoot makes a new root issuer for `meshca root
// prepare`, or adopts an existing one (Config.Issuer), so that a
// rotation moves between Vault issuers under meshca's guards; Issuers
// manages a mount's issuers for those steps and for the per-leaf Vault
// signer's.
//
// What it needs of Vault's policy: update on
// <mount>/issuer/<id>/sign-intermediate, nothing else (listing the
// mount's issuers and reading their certificates are unauthenticated in
// Vault). `meshca root prepare` needs more (docs/upstream.md).
package vaultpki

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/vaultauth"
)

// Name is the upstream's name, in flags and in upstream.Ref.Type.
const Name = "vault-pki"

// Config of the vault-pki upstream.
type Config struct {
	// Login is how meshca logs in to Vault.
	Login vaultauth.Config
	// Mount of the PKI secrets engine; "pki" when empty.
	Mount string
	// Issuer, when set, is the issuer (its name or ID) NewRoot adopts
	// rather than creating a root issuer: an organisation's existing
	// root, or an intermediate whose root is an issuer of the mount too.
	Issuer string
	// Now is the clock the names of new issuers are taken from; nil
	// means time.Now.
	Now func() time.Time
}

// Upstream is the vault-pki upstream. Run keeps its login alive.
type Upstream struct {
	c    Config
	sess *vaultauth.Session
}

var (
	_ upstream.Upstream  = (*Upstream)(nil)
	_ upstream.RootMaker = (*Upstream)(nil)
	_ upstream.Roots     = (*Upstream)(nil)
)

// New returns the upstream; it does no I/O.
func New(c Config) (*Upstream, error) {
	if c.Mount == "" {
		c.Mount = "pki"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	sess, err := vaultauth.NewSession(c.Login)
	if err != nil {
		return nil, fmt.Errorf("vaultpki: %w", err)
	}
	return &Upstream{c: c, sess: sess}, nil
}

// Run keeps the login alive until ctx ends.
func (u *Upstream) Run(ctx context.Context) error { return u.sess.Run(ctx) }

// SignIntermediate asks the issuer req.Ref.Key names to sign req.CSR's
// key as a CA of path length 0 with the subject meshca chose, the trust
// domain's SPIFFE ID, certSign, cRLSign and digitalSignature, backdated
// by certs.Backdate and living req.TTL (Vault would cut it at its
// issuer's expiry; Check refuses that). Chain is what Vault returns
// between the intermediate and its root.
func (u *Upstream) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &upstream.Error{Upstream: Name, Kind: upstream.KindUnavailable, Err: err}
	}
	if err := checkRequest(req, u.c.Now()); err != nil {
		return nil, err
	}
	issuer, err := u.issuer(ctx, req.Ref.Key)
	if err != nil {
		return nil, err
	}
	path := u.c.Mount + "/issuer/" + req.Ref.Key + "/sign-intermediate"
	secret, err := u.sess.Write(ctx, path, signParams(req, backdate(u.c.Now(), issuer)))
	if err != nil {
		return nil, upstreamError(err)
	}
	return signed(secret, path, req.Root)
}

// issuer is the certificate of the mount's issuer id (read without a
// policy).
func (u *Upstream) issuer(ctx context.Context, id string) (*x509.Certificate, error) {
	path := u.c.Mount + "/issuer/" + id + "/json"
	s, err := u.sess.Read(ctx, path)
	switch {
	case err != nil:
		return nil, upstreamError(err)
	case s == nil:
		return nil, errorf(upstream.KindRefused, "%s: no such issuer in Vault", path)
	}
	cert, err := certificateOf(s, "certificate")
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: %v", path, err)
	}
	return cert, nil
}

// backdate is how far before now the intermediate starts: certs.Backdate,
// but never before its issuer, which Vault refuses ("notBefore before
// signer's notBefore"): a root made a minute ago backdates its first
// intermediate by less. A second is kept for Vault's clock.
func backdate(now time.Time, issuer *x509.Certificate) time.Duration {
	return max(0, min(certs.Backdate, now.Sub(issuer.NotBefore)-time.Second)).Truncate(time.Second)
}

// checkRequest refuses what Vault should not be asked, at now: an
// intermediate that would outlive its root is refused, as KeySigned
// refuses it, rather than cut short by Vault (which Check would refuse).
func checkRequest(req *upstream.Request, now time.Time) error {
	switch {
	case req == nil || req.CSR == nil || req.Root == nil:
		return errorf(upstream.KindInternal, "a request needs a CSR and the root")
	case req.TrustDomain.IsZero():
		return errorf(upstream.KindInternal, "the request names no trust domain")
	case req.Ref.Type != Name || req.Ref.Key == "" || strings.ContainsAny(req.Ref.Key, "/?#"):
		return errorf(upstream.KindRefused, "root %q is kept by %q, not by a Vault PKI issuer", req.Root.Subject, req.Ref.Type+" "+req.Ref.Key)
	case req.TTL < time.Second:
		return errorf(upstream.KindInternal, "intermediate TTL %s is under a second", req.TTL)
	}
	if end := now.Add(req.TTL).Truncate(time.Second); end.After(req.Root.NotAfter) {
		return errorf(upstream.KindRefused, "an intermediate ending at %s would outlive its root %q (%s)",
			end.UTC().Format(time.RFC3339), req.Root.Subject, req.Root.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// signParams are sign-intermediate's parameters for req, starting
// backdate before now: nothing is
// taken from the CSR but its key (use_csr_values=false); the one URI SAN
// is the trust domain's SPIFFE ID.
func signParams(req *upstream.Request, backdate time.Duration) map[string]any {
	p := map[string]any{
		"csr":                  string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		"ttl":                  fmt.Sprintf("%ds", int64(req.TTL/time.Second)),
		"not_before_duration":  fmt.Sprintf("%ds", int64(backdate/time.Second)),
		"max_path_length":      0,
		"key_usage":            []string{"CertSign", "CRLSign", "DigitalSignature"},
		"use_csr_values":       false,
		"exclude_cn_from_sans": true,
		"format":               "pem",
		"common_name":          req.Subject.CommonName,
	}
	for key, v := range map[string][]string{
		"organization": req.Subject.Organization, "ou": req.Subject.OrganizationalUnit, "country": req.Subject.Country,
		"locality": req.Subject.Locality, "province": req.Subject.Province,
		"street_address": req.Subject.StreetAddress, "postal_code": req.Subject.PostalCode,
	} {
		if len(v) > 0 {
			p[key] = v
		}
	}
	p["uri_sans"] = req.TrustDomain.ID().String()
	return p
}

// signed parses sign-intermediate's answer: the certificate, and its CA
// chain without itself and without roots. A root in that chain other
// than root means the reference names an issuer of another lineage.
func signed(secret *api.Secret, path string, root *x509.Certificate) (*upstream.Response, error) {
	cert, err := certificateOf(secret, "certificate")
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: %v", path, err)
	}
	chain, err := chainOf(secret)
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: the answer's ca_chain: %v", path, err)
	}
	out := &upstream.Response{Cert: cert}
	for _, c := range chain {
		switch {
		case c.Equal(cert):
		case certs.IsSelfSigned(c) && !c.Equal(root):
			return nil, errorf(upstream.KindRefused, "%s chains to the root %q, not to the CA state's %q: the root's reference names an issuer of another lineage",
				path, c.Subject, root.Subject)
		case !certs.IsSelfSigned(c):
			out.Chain = append(out.Chain, c)
		}
	}
	return out, nil
}

// chainOf parses an answer's ca_chain, a list of PEM blocks.
func chainOf(secret *api.Secret) ([]*x509.Certificate, error) {
	list, _ := secret.Data["ca_chain"].([]any)
	var out []*x509.Certificate
	for _, v := range list {
		p, ok := v.(string)
		if !ok {
			return nil, errors.New("an entry is not a string")
		}
		cs, err := pemutil.ParseCertificates([]byte(p))
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// upstreamError is a Vault failure as an *upstream.Error of the kind
// vaultauth gives it.
func upstreamError(err error) error {
	kind := upstream.KindRefused
	if vaultauth.KindOf(err) == vaultauth.KindUnavailable && !missingIssuer(err) {
		kind = upstream.KindUnavailable
	}
	return &upstream.Error{Upstream: Name, Kind: kind, Err: err}
}

// missingIssuer: Vault has no issuer of the reference meshca sent. Vault
// answers that with a 500, which would otherwise say "retry"; an issuer
// deleted, or a reference of another mount, needs an operator.
func missingIssuer(err error) bool {
	var re *api.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	for _, e := range re.Errors {
		if strings.Contains(e, "unable to find PKI issuer for reference") {
			return true
		}
	}
	return false
}

func errorf(kind upstream.Kind, format string, args ...any) error {
	return &upstream.Error{Upstream: Name, Kind: kind, Err: fmt.Errorf(format, args...)}
}
