// Package vault signs workload certificates with HashiCorp Vault's PKI
// secrets engine (<mount>/sign/<role>), logged in with a token file,
// AppRole or the Kubernetes auth method, and keeps that login alive.
//
// A Vault role fixes the key usages of what it signs, and keeps
// KeyEncipherment for EC keys too (RFC 8813 forbids it there), while
// meshca wants it on RSA keys only (signer.CheckIssued). So RSA keys get a
// role of their own (Config.KeyEnciphermentRole).
//
// The trust bundle is never learned from Vault: Vault answers with its
// issuing CA, often an intermediate. The chain Vault returns only shapes
// the reply; meshca verifies it against its pinned anchors.
package vault

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/vaultauth"
)

const name = "vault"

// Config of the Vault backend.
type Config struct {
	// Address of Vault, e.g. https://vault.vault.svc:8200.
	Address string
	// CACertFile verifies Vault's own TLS certificate.
	CACertFile string
	// Mount of the PKI engine ("pki") and the role to sign with. Role
	// must grant exactly key_usage=DigitalSignature and
	// ext_key_usage=ServerAuth,ClientAuth.
	Mount, Role string
	// KeyEnciphermentRole, when set, replaces Role for requests whose
	// certificate must also carry key encipherment (RSA keys): a role with
	// key_usage=DigitalSignature,KeyEncipherment. When empty, Role signs
	// every request, and an RSA request is refused (FailedPrecondition)
	// because its certificate lacks key encipherment.
	KeyEnciphermentRole string
	// DNSRole signs DNS requests (istiod's serving certificate): a role of
	// its own, whose allowed_domains name exactly the DNS names meshca
	// asks for (allow_bare_domains=true), with require_cn=false,
	// use_csr_sans=false, key_usage=DigitalSignature, server_flag and
	// client_flag. Empty: DNS requests are refused.
	DNSRole string
	// Auth logs in. Its token is renewed while it can be, and a fresh
	// login replaces it when it can no longer be renewed or is refused.
	Auth api.AuthMethod
	// Timeout bounds every call that has no earlier deadline.
	Timeout time.Duration
	// OnLoginError reports failed logins, renewals and revocations of
	// replaced tokens (logged by the caller); nil ignores them. The errors
	// never carry a token.
	OnLoginError func(error)
	// ReloginBackoff is the least time between two logins forced by Vault
	// refusing to sign (403). Within it, a 403 fails as signer.KindRefused
	// without a login. Zero means vaultauth.DefaultReloginBackoff.
	ReloginBackoff time.Duration
	// Now is the clock that ReloginBackoff, the token's expiry and the
	// lifetime of issued certificates are measured on; nil means time.Now.
	Now func() time.Time
	// Observer hears whether the signer holds a token and when it
	// expires; nil ignores it.
	Observer vaultauth.Observer
}

// Signer is the Vault backend: it signs with the roles of a PKI mount,
// logged in by its session (vaultauth). Run keeps the login alive.
type Signer struct {
	c      Config
	client *api.Client
	sess   *vaultauth.Session
	// chains are the CA chains of Vault's answers, parsed.
	chains chainCache
	// backdates are the roles' not_before_duration, for exact lifetimes.
	backdates backdates
}

var _ signer.Signer = (*Signer)(nil)

// New returns a Vault signer; it does no I/O. Run logs in.
func New(c Config) (*Signer, error) {
	if c.Role == "" {
		return nil, errors.New("vault: role is required")
	}
	return newSigner(c)
}

// NewRevoker returns the Revoker of c's mount, which needs no role
// (meshca revoke); it does no I/O, and logs in on its first call.
func NewRevoker(c Config) (signer.Revoker, error) { return newSigner(c) }

func newSigner(c Config) (*Signer, error) {
	switch {
	case c.Address == "":
		return nil, errors.New("vault: address is required")
	case c.Auth == nil:
		return nil, errors.New("vault: a login method is required")
	}
	if c.Mount == "" {
		c.Mount = "pki"
	}
	if c.Timeout <= 0 {
		c.Timeout = vaultauth.DefaultTimeout
	}
	if c.ReloginBackoff <= 0 {
		c.ReloginBackoff = vaultauth.DefaultReloginBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	sess, err := vaultauth.NewSession(vaultauth.Config{
		Address: c.Address, CACertFile: c.CACertFile, Auth: c.Auth, Timeout: c.Timeout,
		OnLoginError: c.OnLoginError, ReloginBackoff: c.ReloginBackoff, Now: c.Now, Observer: c.Observer,
	})
	if err != nil {
		return nil, err
	}
	return &Signer{c: c, client: sess.Client(), sess: sess}, nil
}

// Run keeps the login alive until ctx ends: it renews the token while
// Vault allows and logs in afresh when it no longer does.
func (s *Signer) Run(ctx context.Context) error { return s.sess.Run(ctx) }

// Sign implements signer.Signer with <mount>/sign/<role>, the role
// being the one for req's key usages (roleFor). When Vault
// refuses the token (403), Sign logs in again and retries once, but forces
// at most one such login per Config.ReloginBackoff (see reloginDenied).
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	used, err := s.sess.Current(ctx)
	if err != nil {
		return nil, signerError(err)
	}
	role, err := s.roleFor(req)
	if err != nil {
		return nil, err
	}
	if req.Lifetime <= 0 {
		return s.signOnce(ctx, used, req, role, req.TTL)
	}
	// The role starts the leaf its not_before_duration before now: a leaf
	// of exactly Lifetime ends that much less than Lifetime after now.
	bd, known := s.roleBackdate(ctx, role)
	res, err := s.signOnce(ctx, used, req, role, lifetimeTTL(req.Lifetime, bd))
	if err != nil || known || res.Leaf.NotAfter.Sub(res.Leaf.NotBefore) == req.Lifetime {
		return res, err
	}
	// The backdate was Vault's default, a guess, and the answer taught
	// the role's: that certificate is not the one asked for, and never
	// leaves meshca. Ask once more with the role's.
	if learnt, ok := s.knownBackdate(role); ok && learnt != bd {
		return s.signOnce(ctx, used, req, role, lifetimeTTL(req.Lifetime, learnt))
	}
	return res, nil
}

// lifetimeTTL is the ttl that gives a leaf of lifetime under a role that
// backdates by backdate.
func lifetimeTTL(lifetime, backdate time.Duration) time.Duration {
	return max(lifetime-backdate, time.Second)
}

// signOnce asks role to sign req for ttl (whole seconds), with the login
// used.
func (s *Signer) signOnce(ctx context.Context, used *api.Secret, req *signer.Request, role string, ttl time.Duration) (*signer.Response, error) {
	ttl = ttl.Truncate(time.Second)
	data := map[string]any{
		"csr":                  string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		"ttl":                  fmt.Sprintf("%ds", int64(ttl/time.Second)),
		"format":               "pem",
		"exclude_cn_from_sans": true,
	}
	if req.DNS() {
		data["alt_names"] = strings.Join(req.DNSNames, ",")
	} else {
		data["uri_sans"] = req.ID.String()
	}
	path := s.c.Mount + "/sign/" + role
	start := s.c.Now()
	secret, err := s.client.Logical().WriteWithContext(ctx, path, data)
	if vaultauth.IsPermissionDenied(err) {
		// The token expired or was revoked, or the role's policy refuses:
		// log in again (at most once per ReloginBackoff), then retry once.
		if lerr := s.sess.ReloginDenied(ctx, used, path, err); lerr != nil {
			return nil, signerError(lerr)
		}
		start = s.c.Now()
		secret, err = s.client.Logical().WriteWithContext(ctx, path, data)
	}
	if err != nil {
		return nil, signerError(err)
	}
	return s.response(req, secret, role, start, ttl)
}

// roleFor names the role that signs req: the DNS role for a DNS request,
// which is refused without one; for a workload, the key encipherment
// role when its usages hold key encipherment and one is set, else Role.
func (s *Signer) roleFor(req *signer.Request) (string, error) {
	switch {
	case req.DNS() && s.c.DNSRole == "":
		return "", signer.Errorf(name, signer.KindRefused, "no Vault role is set aside for DNS certificates (istiod's): name one with --vault-istiod-role")
	case req.DNS():
		return s.c.DNSRole, nil
	case s.c.KeyEnciphermentRole != "" && req.Usages.Key&x509.KeyUsageKeyEncipherment != 0:
		return s.c.KeyEnciphermentRole, nil
	}
	return s.c.Role, nil
}

// response assembles and checks what role issued for a request sent at
// start. The CA certificates Vault sent (issuing_ca, or ca_chain, and any
// after the leaf) bound the leaf's lifetime: an answer without any is
// refused, as nothing would then stop a leaf that outlives its issuer.
// Vault's PKI engine always sends issuing_ca.
func (s *Signer) response(req *signer.Request, secret *api.Secret, role string, start time.Time, ttlSent time.Duration) (*signer.Response, error) {
	if secret == nil || secret.Data == nil {
		return nil, signer.Errorf(name, signer.KindInternal, "empty answer from %s/sign/%s", s.c.Mount, role)
	}
	certPEM, _ := secret.Data["certificate"].(string)
	parsed, err := pemutil.ParseCertificates([]byte(certPEM))
	if err != nil || len(parsed) == 0 {
		return nil, signer.Errorf(name, signer.KindInternal, "answer holds no certificate: %v", err)
	}
	leaf := parsed[0]
	var chain []string
	if list, ok := secret.Data["ca_chain"].([]any); ok {
		for _, v := range list {
			if p, ok := v.(string); ok {
				chain = append(chain, p)
			}
		}
	}
	if len(chain) == 0 {
		if p, ok := secret.Data["issuing_ca"].(string); ok {
			chain = []string{p}
		}
	}
	intermediates := parsed[1:]
	path := slices.Clone(parsed[1:])
	for _, p := range chain {
		cs, err := s.chains.parse(p)
		if err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "answer's CA chain: %w", err)
		}
		path = append(path, cs...)
		for _, c := range cs {
			if !certs.IsSelfSigned(c) { // a root travels only in meshca's own bundle
				intermediates = append(intermediates, c)
			}
		}
	}
	if len(path) == 0 {
		return nil, signer.Errorf(name, signer.KindInternal, "answer from %s/sign/%s holds no issuing CA (issuing_ca or ca_chain): the leaf cannot be held to its issuer's expiry", s.c.Mount, role)
	}
	lt := signer.Lifetime{Start: start, IssuerNotAfter: certs.EarliestExpiry(path...)}
	if err := signer.CheckIssued(name, req, leaf, lt); err != nil {
		return nil, s.withRoleHint(err, req, leaf, role)
	}
	s.learn(role, leaf, ttlSent, start, lt.IssuerNotAfter, cappedTTL(secret.Warnings))
	return &signer.Response{Leaf: leaf, Intermediates: intermediates}, nil
}

// withRoleHint tells the operator which role to change when role issued
// other key usages than req's, for longer than req asked, or without the
// URI meshca sent (a role with use_csr_sans=true copies the CSR's names
// instead, and a kubelet's stub CSR names nothing).
func (s *Signer) withRoleHint(err error, req *signer.Request, leaf *x509.Certificate, role string) error {
	var (
		se *signer.Error
		le *signer.LifetimeError
	)
	if !errors.As(err, &se) {
		return err
	}
	const ke = x509.KeyUsageKeyEncipherment
	var hint string
	switch {
	case errors.As(err, &le):
		hint = fmt.Sprintf("role %s/roles/%s must leave the lifetime to the ttl meshca sends: unset its not_after (or Vault's clock is more than %s ahead of meshca's)", s.c.Mount, role, signer.LifetimeSlack)
	case req.DNS() && !slices.Equal(slices.Sorted(slices.Values(leaf.DNSNames)), slices.Sorted(slices.Values(req.DNSNames))):
		hint = fmt.Sprintf("set use_csr_sans=false on role %s/roles/%s, and allowed_domains to the names meshca asks for (%s) with allow_bare_domains=true", s.c.Mount, role, req.Names())
	case !req.DNS() && len(leaf.URIs) == 0 && !slices.ContainsFunc(req.CSR.URIs, func(u *url.URL) bool { return u.String() == req.ID.String() }):
		hint = fmt.Sprintf("set use_csr_sans=false on role %s/roles/%s: meshca sends the identity it authorized as uri_sans, and this CSR does not name it (a kubelet's stub CSR for a pod certificate names nothing)", s.c.Mount, role)
	case leaf.KeyUsage == req.Usages.Key:
		return err
	case req.Usages.Key&ke != 0 && s.c.KeyEnciphermentRole == "":
		hint = fmt.Sprintf("role %s/roles/%s signs every key type; RSA keys need a role of their own with key_usage=%s: name it with --vault-rsa-role (vault.Config.KeyEnciphermentRole)",
			s.c.Mount, role, keyUsageParam(req.Usages.Key))
	case req.Usages.Key&ke == 0 && leaf.KeyUsage&ke != 0 && s.c.KeyEnciphermentRole == "":
		hint = fmt.Sprintf("set key_usage=%s on role %s/roles/%s, and sign RSA keys with a role of their own with key_usage=%s (meshca serve --vault-rsa-role)",
			keyUsageParam(req.Usages.Key), s.c.Mount, role, keyUsageParam(req.Usages.Key|ke))
	default:
		hint = fmt.Sprintf("set key_usage=%s on role %s/roles/%s", keyUsageParam(req.Usages.Key), s.c.Mount, role)
	}
	return &signer.Error{Backend: se.Backend, Kind: se.Kind, Err: fmt.Errorf("%w; %s", se.Err, hint)}
}

// keyUsageParam renders workload key usages (digital signature, and key
// encipherment for RSA keys) as a Vault role's key_usage parameter.
func keyUsageParam(ku x509.KeyUsage) string {
	if ku&x509.KeyUsageKeyEncipherment != 0 {
		return "DigitalSignature,KeyEncipherment"
	}
	return "DigitalSignature"
}

// signerError is a Vault failure as a *signer.Error of the kind
// vaultauth gives it (refused or unavailable).
func signerError(err error) error {
	e := vaultauth.Classify(err)
	kind := signer.KindRefused
	if e.Kind == vaultauth.KindUnavailable {
		kind = signer.KindUnavailable
	}
	return &signer.Error{Backend: name, Kind: kind, Err: e.Err}
}
