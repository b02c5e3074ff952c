// Package cfssl signs workload certificates with CloudFlare's cfssl: in
// process with cfssl's local signer and a cfssl signing policy, or through
// a remote `cfssl serve` (or multirootca), authenticated when an auth key
// is configured.
//
// meshca's rules hold on top of cfssl's: the SPIFFE ID is the only SAN, the
// validity is requested explicitly and never reaches past the issuer, and
// a profile that grants more than workloads may have is refused rather
// than silently issued (signer.CheckIssued).
package cfssl

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cloudflare/cfssl/api/client"
	"github.com/cloudflare/cfssl/auth"
	"github.com/cloudflare/cfssl/config"
	cferrors "github.com/cloudflare/cfssl/errors"
	cfsigner "github.com/cloudflare/cfssl/signer"
	cflocal "github.com/cloudflare/cfssl/signer/local"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
)

const name = "cfssl"

// lifetimeSlack is how far past the requested NotAfter a certificate may
// end: cfssl rounds, and a profile's expiry counts from its own clock.
const lifetimeSlack = 2 * time.Minute

// Signer is a cfssl backend.
type Signer struct {
	sign    func(ctx context.Context, req cfsigner.SignRequest) ([]byte, error)
	issuer  func(ctx context.Context) (*x509.Certificate, error)
	chain   []*x509.Certificate
	profile string
	label   string
	now     func() time.Time
}

var _ signer.Signer = (*Signer)(nil)

// LocalConfig configures in-process signing.
type LocalConfig struct {
	CACert *x509.Certificate
	CAKey  crypto.Signer
	// Chain holds the certificates above CACert up to (not including) the
	// root, sent with every leaf.
	Chain []*x509.Certificate
	// Policy is a cfssl signing configuration; its profile usages are in
	// the cfssl vocabulary. DefaultPolicy when nil.
	Policy  *config.Signing
	Profile string
	Now     func() time.Time
}

// DefaultPolicy grants workloads digital signature, server auth and
// client auth, for at most 90 days.
func DefaultPolicy() *config.Signing {
	p := &config.SigningProfile{
		Usage:        []string{"digital signature", "server auth", "client auth"},
		Expiry:       90 * 24 * time.Hour,
		ExpiryString: "2160h",
	}
	return &config.Signing{Default: p, Profiles: map[string]*config.SigningProfile{}}
}

// NewLocal returns an in-process cfssl signer.
func NewLocal(c LocalConfig) (*Signer, error) {
	if c.CACert == nil || c.CAKey == nil {
		return nil, errors.New("cfssl: CA certificate and key are required")
	}
	if c.Policy == nil {
		c.Policy = DefaultPolicy()
	}
	if !c.Policy.Valid() {
		return nil, errors.New("cfssl: invalid signing policy")
	}
	ls, err := cflocal.NewSigner(c.CAKey, c.CACert, cfsigner.DefaultSigAlgo(c.CAKey), c.Policy)
	if err != nil {
		return nil, fmt.Errorf("cfssl: %w", err)
	}
	chain := c.Chain
	if !isSelfSigned(c.CACert) {
		chain = append([]*x509.Certificate{c.CACert}, c.Chain...)
	}
	return &Signer{
		sign: func(ctx context.Context, req cfsigner.SignRequest) ([]byte, error) {
			out, err := ls.Sign(req)
			if err != nil {
				return nil, signer.Errorf(name, signer.KindRefused, "cfssl refused: %w", err)
			}
			return out, nil
		},
		issuer:  func(context.Context) (*x509.Certificate, error) { return c.CACert, nil },
		chain:   chain,
		profile: c.Profile,
		now:     nowOr(c.Now),
	}, nil
}

// RemoteConfig configures signing through a cfssl server.
type RemoteConfig struct {
	// URL of the server, e.g. https://cfssl.pki.svc:8888.
	URL string
	// TLS for an https URL; nil uses the system roots.
	TLS *tls.Config
	// AuthKey, when set, makes requests authsign requests with this hex
	// HMAC key (cfssl's "standard" auth provider).
	AuthKey string
	Profile string
	Label   string
	// Issuer is the certificate the server signs with. When nil it is read
	// once from the server's info endpoint. Either way it only shapes the
	// chain: trust comes from meshca's pinned trust anchors.
	Issuer *x509.Certificate
	// Chain holds the certificates above the issuer, without the root.
	Chain   []*x509.Certificate
	Timeout time.Duration
	Now     func() time.Time
}

// NewRemote returns a signer that calls a cfssl server.
func NewRemote(c RemoteConfig) (*Signer, error) {
	if c.URL == "" {
		return nil, errors.New("cfssl: server URL is required")
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	var remote client.Remote
	if c.AuthKey != "" {
		provider, err := auth.New(c.AuthKey, nil)
		if err != nil {
			return nil, fmt.Errorf("cfssl: auth key: %w", err)
		}
		remote = client.NewAuthServer(c.URL, c.TLS, provider)
	} else {
		remote = client.NewServerTLS(c.URL, c.TLS)
	}
	if remote == nil {
		return nil, fmt.Errorf("cfssl: cannot use server URL %q", c.URL)
	}
	remote.SetRequestTimeout(c.Timeout)
	s := &Signer{chain: c.Chain, profile: c.Profile, label: c.Label, now: nowOr(c.Now)}
	s.sign = func(ctx context.Context, req cfsigner.SignRequest) ([]byte, error) {
		body, err := json.Marshal(req)
		if err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "encode request: %w", err)
		}
		return withContext(ctx, func() ([]byte, error) { return remote.Sign(body) })
	}
	var (
		mu     sync.Mutex
		issuer = c.Issuer
	)
	s.issuer = func(ctx context.Context) (*x509.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if issuer != nil {
			return issuer, nil
		}
		body, _ := json.Marshal(map[string]string{"label": c.Label, "profile": c.Profile})
		info, err := withContext(ctx, func() ([]byte, error) {
			resp, err := remote.Info(body)
			if err != nil {
				return nil, err
			}
			return []byte(resp.Certificate), nil
		})
		if err != nil {
			return nil, err
		}
		certs, err := pemutil.ParseCertificates(info)
		if err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "server's info certificate: %w", err)
		}
		issuer = certs[0]
		return issuer, nil
	}
	return s, nil
}

// withContext runs a blocking cfssl client call and gives up when ctx
// ends; the client's own timeout bounds the abandoned call.
func withContext(ctx context.Context, call func() ([]byte, error)) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := call()
		done <- result{b, err}
	}()
	select {
	case <-ctx.Done():
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: ctx.Err()}
	case r := <-done:
		if r.err != nil {
			return nil, classify(r.err)
		}
		return r.b, nil
	}
}

// classify tells a server that cannot be reached (retry) from one that
// answers with a refusal (an operator must act).
func classify(err error) error {
	var ce *cferrors.Error
	if errors.As(err, &ce) && strings.Contains(ce.Message, "failed POST to") {
		return &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	return &signer.Error{Backend: name, Kind: signer.KindRefused, Err: err}
}

// Sign implements signer.Signer.
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	issuer, err := s.issuer(ctx)
	if err != nil {
		return nil, err
	}
	limit := issuer.NotAfter
	for _, c := range s.chain {
		if c.NotAfter.Before(limit) {
			limit = c.NotAfter
		}
	}
	now := s.now()
	notBefore := now.Add(-keymgr.Backdate)
	if notBefore.Before(issuer.NotBefore) {
		notBefore = issuer.NotBefore
	}
	notAfter := now.Add(req.TTL)
	if notAfter.After(limit) {
		notAfter = limit
	}
	out, err := s.sign(ctx, cfsigner.SignRequest{
		Hosts:     []string{req.ID.String()},
		Request:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		Profile:   s.profile,
		Label:     s.label,
		NotBefore: notBefore.UTC().Truncate(time.Second),
		NotAfter:  notAfter.UTC().Truncate(time.Second),
	})
	if err != nil {
		return nil, err
	}
	certs, err := pemutil.ParseCertificates(out)
	if err != nil || len(certs) != 1 {
		return nil, signer.Errorf(name, signer.KindInternal, "cfssl returned no single certificate: %v", err)
	}
	leaf := certs[0]
	if err := signer.CheckIssued(name, req, leaf, limit); err != nil {
		return nil, err
	}
	// A remote cfssl ignores the requested validity: its profile's expiry
	// decides. Never hand out more than the client asked for.
	if leaf.NotAfter.After(notAfter.Add(lifetimeSlack)) {
		return nil, signer.Errorf(name, signer.KindRefused,
			"cfssl issued a certificate until %s, past the requested %s: set the profile's expiry to at most the TTL clients request (24h for ztunnel and istio-agent)",
			leaf.NotAfter.UTC().Format(time.RFC3339), notAfter.UTC().Format(time.RFC3339))
	}
	return &signer.Response{Leaf: leaf, Intermediates: s.intermediates(issuer)}, nil
}

// intermediates is the issuer (unless it is a root) and the configured
// chain above it.
func (s *Signer) intermediates(issuer *x509.Certificate) []*x509.Certificate {
	if isSelfSigned(issuer) {
		return s.chain
	}
	for _, c := range s.chain {
		if c.Equal(issuer) {
			return s.chain
		}
	}
	return append([]*x509.Certificate{issuer}, s.chain...)
}

func isSelfSigned(c *x509.Certificate) bool {
	return string(c.RawIssuer) == string(c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

func nowOr(f func() time.Time) func() time.Time {
	if f == nil {
		return time.Now
	}
	return f
}
