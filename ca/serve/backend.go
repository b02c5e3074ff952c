package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Backend is the signer's configuration, its files already read.
type Backend struct {
	// External is the signing backend when it is not the built-in CA;
	// nil: the built-in one.
	External External
	// The built-in CA: the CA state in StateDir or in the Secret
	// StateSecret ("namespace/name", in the local cluster), whose first
	// root is generated on first start (its organisation is the trust
	// domain unless State says otherwise) and which the server follows as
	// `meshca root` rotates it; or a plugged-in CA in CADir. Exactly one.
	// An external backend's trust bundle comes from a CA state too (its
	// authorities hold certificates only), or from TrustAnchors.
	StateDir    string
	StateSecret string
	State       dirstore.StateOptions
	CADir       string
	// Upstream renews the signing intermediate of the CA state from an
	// upstream; nil: none. Only with the built-in CA and a CA state.
	Upstream *Upstream
	// AutoRotate takes rotation steps for generated roots on its own
	// (keymgr.AutoRotator), looking every AutoRotateInterval
	// (keymgr.DefaultAutoRotateInterval when zero); Rotation holds the
	// guards' margin and PrepareAt when the next root is prepared.
	AutoRotate         bool
	AutoRotateInterval time.Duration
	Rotation           keymgr.Guards
	PrepareAt          float64
	// CRL keeps the CRLs of the CA state's CAs; nil: off. Only with the
	// built-in CA and a CA state.
	CRL *CRL
	// MaxTTL is the longest leaf any earlier meshca may have issued under
	// a state directory migrated from the single-root layout, which kept
	// no record of its leaves: the guards assume leaves that long.
	MaxTTL time.Duration
	// Backdate is how far before now issued certificates start, to
	// tolerate clock skew: leaves of the built-in CA and of external
	// backends that take it (ExternalEnv.Backdate), and the serving
	// certificate meshca issues itself. As in certs.WindowOptions, zero
	// means certs.Backdate and certs.NoBackdate means none.
	Backdate time.Duration
	// An external backend's pinned trust bundle, and the files of the
	// serving certificate the operator provides (its chain, leaf first,
	// and its key), followed as they are renewed. Without them, meshca
	// issues its own from the backend's CA when it holds its key
	// (Opened.CA).
	TrustAnchors                    []*x509.Certificate
	ServingCertFile, ServingKeyFile string
	// localKubeconfig is the local cluster's (Clusters.LocalKubeconfig).
	localKubeconfig string
	// audit receives automatic rotation steps (Config.Audit).
	audit ca.AuditSink
}

// backend is the assembled signer with its trust bundle, serving
// certificate and the loops that keep them alive.
type backend struct {
	name    string
	signer  signer.Signer
	bundles x509bundle.Source
	expiry  ca.ExpirySource
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// servingFiles is the operator's serving certificate, when given.
	servingFiles *keymgr.ServingFiles
	// signing is the certificate that signs for the CA now; nil when
	// meshca does not know it (a pinned bundle).
	signing func() *x509.Certificate
	// rotator is the automatic rotation, when on; its dependents are set
	// once the keeper of istiod's certificate is assembled.
	rotator *keymgr.AutoRotator
	runners []func(context.Context) error
	// onChange hear of every CA state put in service; set before Run.
	onChange []func()
	// health follows an external backend for readiness; nil for the
	// in-process ones.
	health *backendHealth
	// renewer renews the built-in CA's intermediate from its upstream;
	// nil without one. defaultTTL is the leaves' (Config.DefaultTTL).
	renewer    *keymgr.Renewer
	defaultTTL time.Duration
	// version is the CA state in service's place in its history (nil
	// without one; no Lineage for a plugged-in directory, whose sequence
	// each process counts alone), stored after the state's bundle is
	// served and before onChange hear of it: a reader that loads it
	// before the bundle never pairs a bundle with a newer version.
	version atomic.Pointer[trust.BundleVersion]
	// crl is the CA state in service's revocation lists with its
	// version, stored together before version (nil without a state).
	crl atomic.Pointer[trust.Bundle]
	// revoked is what the CA state in service revokes, which the server
	// reads on each request (NodeBlocked, Revoked).
	revoked atomic.Pointer[revokedSet]
	// revoker: an external backend's own CRLs (Vault); crlSource, set
	// before Run, keeps crl on them in place of the CA state's.
	revoker   signer.Revoker
	crlSource *crlSource
}

// crlBundle is the CRLs to publish as istio-ca-crl, and their version;
// empty without a CA state, or while it has none.
func (be *backend) crlBundle() trust.Bundle {
	if b := be.crl.Load(); b != nil {
		return *b
	}
	return trust.Bundle{}
}

// name is the backend's name: --signer's value.
func (c Backend) name() string {
	if c.External == nil {
		return BackendLocal
	}
	return c.External.Name()
}

// sequence is the Sequence of the CA state in service; zero without one.
func (be *backend) sequence() uint64 {
	if v := be.version.Load(); v != nil {
		return v.Sequence
	}
	return 0
}

func newBackend(ctx context.Context, c Backend, td spiffeid.TrustDomain, names []string, newStore storeOpener, reg prometheus.Registerer,
	leaders *leaderprom.Metrics, log *slog.Logger) (*backend, error) {
	if c.External == nil {
		return newLocal(ctx, c, td, names, newStore, reg, leaders, log)
	}
	if c.Upstream != nil {
		return nil, &FieldError{Field: "upstream", Err: fmt.Errorf("renews the built-in CA's intermediate, which --signer %s does not sign with: choose one", c.External.Name())}
	}
	if c.CRL != nil {
		return nil, &FieldError{Field: "crl", Err: fmt.Errorf("meshca signs the CRLs of the built-in CA's authorities, and --signer %s signs elsewhere (docs/backends.md)", c.External.Name())}
	}
	if len(c.TrustAnchors) > 0 == (c.StateDir != "" || c.StateSecret != "") {
		return nil, &FieldError{Field: "trust-anchors", Err: errors.New("an external backend needs exactly one of the pinned trust bundle and a CA state")}
	}
	be := &backend{name: c.name()}
	health := newBackendHealth(be.name, nil, log, nil)
	opened, err := c.External.Open(ctx, ExternalEnv{TrustDomain: td, Backdate: c.Backdate, LocalKubeconfig: c.localKubeconfig,
		Roots: be.roots(td), Health: health, Registerer: reg, Log: log})
	if err != nil {
		return nil, err
	}
	be.signer, be.runners = opened.Signer, append(be.runners, opened.Runners...)
	be.revoker, _ = opened.Signer.(signer.Revoker)
	if opened.Remote {
		// The backend's own answers, before the CA state judges them.
		be.health, health.probe = health, opened.Probe
		be.signer = signer.Observe(be.signer, be.name, be.health)
		if be.health.probe != nil {
			be.runners = append(be.runners, be.health.Run)
		}
	}
	roots := c.TrustAnchors
	if len(roots) > 0 {
		be.bundles, be.expiry = x509bundle.FromX509Authorities(td, roots), anchorExpiry(roots)
	} else {
		ext, err := be.followExternal(ctx, c, td, newStore, reg, log)
		if err != nil {
			return nil, err
		}
		b, _ := ext.GetX509BundleForTrustDomain(td)
		roots = b.X509Authorities()
	}
	if c.ServingCertFile != "" {
		if err := be.followServing(c, td, reg, log); err != nil {
			return nil, err
		}
		return be, nil
	}
	if opened.CA == nil {
		return nil, &FieldError{Field: "serving-cert-file", Err: errors.New("meshca holds no CA key to issue its own serving certificate: give one")}
	}
	a := *opened.CA
	a.Roots = roots
	if err := a.Validate(time.Now()); err != nil {
		return nil, &FieldError{Field: opened.CAFlag, Err: fmt.Errorf("with the trusted roots: %w", err)}
	}
	_, err = be.serving(keymgr.NewManager(td, &a), names, c.Backdate, log)
	return be, err
}

// roots reads the trust bundle be serves, once it serves one.
func (be *backend) roots(td spiffeid.TrustDomain) func() []*x509.Certificate {
	return func() []*x509.Certificate {
		if be.bundles == nil {
			return nil
		}
		b, err := be.bundles.GetX509BundleForTrustDomain(td)
		if err != nil {
			return nil
		}
		return b.X509Authorities()
	}
}

// storeOpener opens the CA state Secret "namespace/name".
type storeOpener func(secret string) (keymgr.StateStore, error)

// openState opens the CA state store c names, and reports the name of
// the flag that named it.
func openState(c Backend, newStore storeOpener) (keymgr.StateStore, string, error) {
	if c.StateSecret == "" {
		return &dirstore.Store{Dir: c.StateDir, LockTimeout: c.State.LockTimeout, MigrationTTL: c.MaxTTL}, "state-dir", nil
	}
	store, err := newStore(c.StateSecret)
	if err != nil {
		return nil, "", &FieldError{Field: "state-secret", Err: err}
	}
	return store, "state-secret", nil
}

// tidy completes, on a state directory, the cleanup a crash cut short
// (a retired key left on disk, say); a failure is logged, not fatal.
func tidy(ctx context.Context, store keymgr.StateStore, log *slog.Logger) {
	if d, ok := store.(*dirstore.Store); ok {
		if err := d.Tidy(ctx); err != nil {
			log.Warn("CA state directory not tidied", "error", err)
		}
	}
}

// newLocal is the built-in CA: a plugged-in CA from CADir, or the CA
// state in a store, followed as it rotates.
func newLocal(ctx context.Context, c Backend, td spiffeid.TrustDomain, names []string, newStore storeOpener, reg prometheus.Registerer,
	leaders *leaderprom.Metrics, log *slog.Logger) (*backend, error) {
	sources := 0
	for _, set := range []bool{c.StateDir != "", c.StateSecret != "", c.CADir != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return nil, &FieldError{Field: "state-dir", Err: errors.New("give exactly one of a state directory or Secret (self-signed CA) and a CA directory (plugged-in CA)")}
	}
	if c.CADir != "" && c.CRL != nil {
		return nil, &FieldError{Field: "crl", Err: errors.New("keeps CRLs in a CA state (--state-dir, --state-secret); a plugged-in CA (--ca-dir) has none")}
	}
	if c.CADir != "" && c.Upstream != nil {
		return nil, &FieldError{Field: "upstream", Err: errors.New("renews an intermediate in a CA state (--state-dir, --state-secret); a plugged-in CA (--ca-dir) is renewed by its owner")}
	}
	if c.CADir != "" {
		return newPlugged(ctx, c, td, names, reg, log)
	}
	store, field, err := openState(c, newStore)
	if err != nil {
		return nil, err
	}
	ren, err := c.openRenewer(ctx, store, td, reg, log)
	if err != nil {
		return nil, err
	}
	st, a, err := loadState(ctx, c, store, ren, td, log)
	if err != nil {
		return nil, &FieldError{Field: field, Err: err}
	}
	active := st.Active()
	log.Info("CA state ready", field, c.StateDir+c.StateSecret, "active", active.ID(), "subject", active.Root.Subject.String(),
		"not_after", active.Cert.NotAfter, "roots", len(a.Roots), "sequence", st.Sequence)
	mgr := keymgr.NewManager(td, a)
	if c.CRL != nil {
		mgr.HoldNew(c.CRL.Propagation)
	}
	issued := &keymgr.IssuanceLog{Store: store}
	be := &backend{name: BackendLocal, signer: local.New(local.Config{Authorities: mgr, Record: issued.Record, Backdate: c.Backdate, Renewal: renewalWhy(ren)}),
		bundles: mgr, expiry: mgr, signing: mgr.Signing, renewer: ren}
	rot, err := be.serving(mgr, names, c.Backdate, log)
	if err != nil {
		return nil, err
	}
	metrics := keymgrprom.New(reg)
	f := be.follower(store, mgr, metrics, log, func() {
		if err := rot.Renew(); err != nil {
			log.Error("serving certificate renewal failed", "error", err)
		}
	})
	if _, err := f.Sync(ctx); err != nil {
		return nil, &FieldError{Field: field, Err: err}
	}
	be.runners = append(be.runners, f.Run)
	if r, ok := upstreamRunner(ren); ok {
		be.runners = append(be.runners, r)
	}
	var elected []func(context.Context) error
	if ren != nil {
		elected = append(elected, be.renewing(ctx, c, ren, f, metrics, log))
	}
	if run := c.crlKeeper(be, store, ren, f, metrics, log); run != nil {
		elected = append(elected, run)
	}
	if c.AutoRotate {
		r := &keymgr.AutoRotator{Store: store, Guards: c.Rotation, Policy: keymgr.AutoPolicy{PrepareAt: c.PrepareAt}, Interval: c.AutoRotateInterval,
			Generate: nextAuthority(ren),
			OnStep: func(s keymgr.Step) {
				metrics.Step(s.Verb)
				c.audit.Audit(ctx, &ca.AuditEvent{Event: ca.EventRotation, Decision: ca.DecisionTaken, Message: "automatic rotation step",
					Source: ca.SourceAuto, Caller: "meshca", Verb: s.Verb, Authority: s.ID, Reason: s.Why, Backend: BackendLocal})
				if _, err := f.Sync(ctx); err != nil {
					log.Error("CA state not used", "error", err)
				}
			},
			OnError: func(err error) { log.Error("automatic rotation failed", "error", err) }}
		be.rotator = r
		elected = append(elected, r.Run)
	}
	if len(elected) > 0 {
		// The state's compare-and-swap keeps replicas from taking one step
		// or renewal twice; the Lease keeps them from racing for it (and
		// calling the upstream) at all.
		be.runners = append(be.runners, electedOn(store, all(elected), leaders, log))
	}
	return be, nil
}

// loadState loads the CA state in store, bootstrapping its first
// authority when there is none (with an upstream, a root made there and
// its first intermediate; else a root of its own), and returns it with
// the authority it signs with. With an upstream whose intermediate is
// due, one renewal is tried first: a replica that starts after the
// intermediate expired renews it before it serves.
func loadState(ctx context.Context, c Backend, store keymgr.StateStore, ren *keymgr.Renewer, td spiffeid.TrustDomain,
	log *slog.Logger) (*keymgr.State, *keymgr.Authority, error) {
	o := c.State
	if o.Organization == "" {
		o.Organization = td.Name()
	}
	if err := completeMigration(ctx, store, c.MaxTTL, log); err != nil {
		return nil, nil, err
	}
	tidy(ctx, store, log)
	st, err := keymgr.LoadOrBootstrapDiscarding(ctx, store, func() (*keymgr.AuthorityRecord, error) {
		ro := keymgr.RootOptions{KeyType: o.KeyType, Organization: o.Organization, TTL: o.RootTTL}
		if ren != nil {
			return ren.NewAuthority(ctx, ro)
		}
		a, err := keymgr.NewRoot(ro)
		if err != nil {
			return nil, err
		}
		return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
	}, discardRoot(ctx, ren, log), time.Now())
	if err != nil {
		return nil, nil, err
	}
	if err := st.Validate(); err != nil {
		return nil, nil, err
	}
	a, err := keymgr.StateAuthority(st, time.Now())
	if err != nil && ren != nil {
		if _, renewed, rerr := ren.Tick(ctx); renewed {
			st, _, err = store.Load(ctx)
			if err == nil {
				a, err = keymgr.StateAuthority(st, time.Now())
			}
		} else if rerr != nil {
			err = fmt.Errorf("%w; and its renewal from upstream %s failed: %v", err, ren.Name, rerr)
		}
	}
	return st, a, err
}

// discardRoot destroys the root key a replica made in the upstream for a
// first authority the state did not take (another replica bootstrapped
// first), or logs which key is left there: the state is sound either
// way, so it never fails the start.
func discardRoot(ctx context.Context, ren *keymgr.Renewer, log *slog.Logger) func(*keymgr.AuthorityRecord) error {
	return func(made *keymgr.AuthorityRecord) error {
		if ren == nil {
			return nil
		}
		destroyed, err := ren.Discard(ctx, made)
		if err != nil {
			log.Warn("a root key made for the first authority is left in the upstream", "upstream", ren.Name, "key", made.Upstream.Key, "error", err)
		} else if destroyed {
			log.Info("another replica bootstrapped first; the root key made for this one is destroyed", "upstream", ren.Name, "key", made.Upstream.Key)
		}
		return nil
	}
}

// completeMigration saves a state directory found in the single-root
// layout as a state (dirstore.MigrateSingleRoot), with the record that
// leaves of up to maxTTL (the store's MigrationTTL) were issued under it.
func completeMigration(ctx context.Context, store keymgr.StateStore, maxTTL time.Duration, log *slog.Logger) error {
	migrated, err := dirstore.MigrateSingleRoot(ctx, store)
	if migrated {
		log.Warn("CA state migrated from the single-root layout; rotation guards assume leaves of up to --max-ttl were issued under it",
			"max_ttl", maxTTL)
	}
	return err
}

// newPlugged is the built-in CA on a plugged-in CA directory, followed as
// its owner renews it (dirstore.PluggedDir): a new CA under a root already
// served signs within one follow interval; one under a root workloads do
// not trust yet is refused, and the last good CA keeps signing.
func newPlugged(ctx context.Context, c Backend, td spiffeid.TrustDomain, names []string, reg prometheus.Registerer, log *slog.Logger) (*backend, error) {
	dir := &dirstore.PluggedDir{Dir: c.CADir}
	st, _, err := dir.Load(ctx)
	if err != nil {
		return nil, &FieldError{Field: "ca-dir", Err: err}
	}
	a, err := keymgr.StateAuthority(st, time.Now())
	if err != nil {
		return nil, &FieldError{Field: "ca-dir", Err: err}
	}
	log.Info("loaded plugged-in CA", "dir", c.CADir, "subject", a.Cert.Subject.String(), "not_after", a.NotAfter())
	mgr := keymgr.NewManager(td, a)
	be := &backend{name: BackendLocal, signer: local.New(local.Config{Authorities: mgr, Backdate: c.Backdate}), bundles: mgr, expiry: mgr,
		signing: mgr.Signing}
	rot, err := be.serving(mgr, names, c.Backdate, log)
	if err != nil {
		return nil, err
	}
	f := be.follower(dir, dirstore.PluggedTarget{Manager: mgr}, keymgrprom.New(reg), log, func() {
		if err := rot.Renew(); err != nil {
			log.Error("serving certificate renewal failed", "error", err)
		}
	})
	if _, err := f.Sync(ctx); err != nil {
		return nil, &FieldError{Field: "ca-dir", Err: err}
	}
	be.runners = append(be.runners, f.Run)
	return be, nil
}

func (be *backend) serving(mgr *keymgr.Manager, names []string, backdate time.Duration, log *slog.Logger) (*keymgr.ServingRotator, error) {
	rot, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{Names: names, Backdate: backdate}, nil)
	if err != nil {
		return nil, &FieldError{Field: "serving-dns-names", Err: err}
	}
	rot.OnError = func(err error) { log.Error("serving certificate renewal failed", "error", err) }
	be.getCert = rot.GetCertificate
	be.runners = append(be.runners, rot.Run)
	return rot, nil
}

// anchorExpiry reports the pinned anchors' expiry for the citadel gauges.
type anchorExpiry []*x509.Certificate

// RootNotAfter implements ca.ExpirySource.
func (a anchorExpiry) RootNotAfter() time.Time { return certs.EarliestExpiry(a...) }

// ChainNotAfter is the anchors' too: an external backend's issuing chain is
// not known before it signs.
func (a anchorExpiry) ChainNotAfter() time.Time { return a.RootNotAfter() }
