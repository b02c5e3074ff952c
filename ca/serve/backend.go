package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/local"
	"github.com/meshca/meshca/signer/vault"
)

// Backend kinds.
const (
	BackendLocal = "local"
	BackendCfssl = "cfssl"
	BackendVault = "vault"
)

// Backend is the signer's configuration, its files already read.
type Backend struct {
	// Kind is BackendLocal, BackendCfssl or BackendVault.
	Kind string
	// Local: a self-signed CA in StateDir, generated on first start (its
	// organisation is the trust domain unless State says otherwise), or a
	// plugged-in CA in CADir. Exactly one of them.
	StateDir string
	State    keymgr.StateOptions
	CADir    string
	// External backends (exactly one of CfsslRemote, CfsslLocal, Vault):
	// the pinned trust bundle, and the serving certificate the operator
	// provides. Without one, meshca issues its own from the in-process
	// cfssl CA (the only external backend whose key it holds).
	TrustAnchors []*x509.Certificate
	Serving      *tls.Certificate
	CfsslRemote  *cfssl.RemoteConfig
	CfsslLocal   *cfssl.LocalConfig
	Vault        *vault.Config
}

// backend is the assembled signer with its trust bundle, serving
// certificate and the loops that keep them alive.
type backend struct {
	name    string
	signer  signer.Signer
	bundles x509bundle.Source
	expiry  ca.ExpirySource
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	runners []func(context.Context) error
}

func newBackend(c Backend, td spiffeid.TrustDomain, names []string, log *slog.Logger) (*backend, error) {
	if c.Kind == BackendLocal {
		a, err := loadAuthority(c, td, log)
		if err != nil {
			return nil, err
		}
		mgr := keymgr.NewManager(td, a)
		be := &backend{name: BackendLocal, signer: local.New(local.Config{Authorities: mgr}), bundles: mgr, expiry: mgr}
		return be, be.rotateServing(mgr, names, log)
	}
	if len(c.TrustAnchors) == 0 {
		return nil, &FieldError{Field: "trust-anchors", Err: errors.New("an external backend needs the pinned trust bundle")}
	}
	be := &backend{name: c.Kind, bundles: x509bundle.FromX509Authorities(td, c.TrustAnchors), expiry: anchorExpiry(c.TrustAnchors)}
	var err error
	switch {
	case c.Kind == BackendVault && c.Vault != nil:
		var s *vault.Signer
		if s, err = vault.New(*c.Vault); err != nil {
			return nil, &FieldError{Field: "vault-addr", Err: err}
		}
		be.signer, be.runners = s, append(be.runners, s.Run)
	case c.Kind == BackendCfssl && c.CfsslRemote != nil:
		if be.signer, err = cfssl.NewRemote(*c.CfsslRemote); err != nil {
			return nil, &FieldError{Field: "cfssl-url", Err: err}
		}
	case c.Kind == BackendCfssl && c.CfsslLocal != nil:
		if be.signer, err = cfssl.NewLocal(*c.CfsslLocal); err != nil {
			return nil, &FieldError{Field: "cfssl-ca-cert", Err: err}
		}
	default:
		return nil, fmt.Errorf("serve: backend %q lacks its configuration", c.Kind)
	}
	if c.Serving != nil {
		cert := c.Serving
		be.getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
		return be, nil
	}
	if c.CfsslLocal == nil {
		return nil, &FieldError{Field: "serving-cert-file", Err: errors.New("meshca holds no CA key to issue its own serving certificate: give one")}
	}
	l := c.CfsslLocal
	a := &keymgr.Authority{Cert: l.CACert, Key: l.CAKey, Chain: l.Chain, Roots: c.TrustAnchors}
	if err := a.Validate(time.Now()); err != nil {
		return nil, &FieldError{Field: "cfssl-ca-cert", Err: fmt.Errorf("with the trust anchors: %w", err)}
	}
	return be, be.rotateServing(keymgr.NewManager(td, a), names, log)
}

// loadAuthority loads the plugged-in CA, or loads or generates the
// self-signed one.
func loadAuthority(c Backend, td spiffeid.TrustDomain, log *slog.Logger) (*keymgr.Authority, error) {
	switch {
	case (c.StateDir == "") == (c.CADir == ""):
		return nil, &FieldError{Field: "state-dir", Err: errors.New("give exactly one of a state directory (self-signed CA) and a CA directory (plugged-in CA)")}
	case c.CADir != "":
		a, err := keymgr.LoadCACerts(c.CADir, time.Now())
		if err != nil {
			return nil, &FieldError{Field: "ca-dir", Err: err}
		}
		log.Info("loaded plugged-in CA", "dir", c.CADir, "subject", a.Cert.Subject.String(), "not_after", a.NotAfter())
		return a, nil
	}
	o := c.State
	if o.Organization == "" {
		o.Organization = td.Name()
	}
	a, created, err := keymgr.LoadOrCreate(c.StateDir, o)
	if err != nil {
		return nil, &FieldError{Field: "state-dir", Err: err}
	}
	log.Info("self-signed CA ready", "dir", c.StateDir, "created", created, "subject", a.Cert.Subject.String(), "not_after", a.Cert.NotAfter)
	return a, nil
}

// rotateServing issues meshca's serving certificate from the CA and keeps
// it fresh.
func (be *backend) rotateServing(mgr *keymgr.Manager, names []string, log *slog.Logger) error {
	rot, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{Names: names}, nil)
	if err != nil {
		return &FieldError{Field: "serving-dns-names", Err: err}
	}
	rot.OnError = func(err error) { log.Error("serving certificate renewal failed", "error", err) }
	be.getCert = rot.GetCertificate
	be.runners = append(be.runners, rot.Run)
	return nil
}

// anchorExpiry reports the pinned anchors' expiry for the citadel gauges.
type anchorExpiry []*x509.Certificate

// RootNotAfter implements ca.ExpirySource.
func (a anchorExpiry) RootNotAfter() time.Time { return keymgr.EarliestExpiry(a...) }

// ChainNotAfter is the anchors' too: an external backend's issuing chain is
// not known before it signs.
func (a anchorExpiry) ChainNotAfter() time.Time { return a.RootNotAfter() }
