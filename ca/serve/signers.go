package serve

import (
	"context"
	"crypto/x509"
	"log/slog"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BackendLocal is the built-in CA's name (--signer local), the backend
// the assembly builds itself. Every other one is an External.
const BackendLocal = "local"

// External is a signing backend outside the built-in CA (cfssl, Vault,
// Kubernetes CertificateSigningRequests...). The command describes each
// one in a file of its own, flags and checks included, and hands the
// assembly its configuration behind this interface: the assembly wraps
// what Open returns in the same CA state, readiness, metrics and request
// path for all of them, and never names one.
type External interface {
	// Name is --signer's value, as logs, metrics and readiness tell it.
	Name() string
	// Open builds the signer; ctx bounds that work, and env is what the
	// assembly lends it. It starts no goroutine: Opened.Runners do.
	Open(ctx context.Context, env ExternalEnv) (*Opened, error)
	// IstiodCert says why the backend, as configured, cannot issue
	// istiod's certificate (a *FieldError naming the flag to set); nil:
	// it can.
	IstiodCert() error
	// PodCertificates says why the backend cannot sign pod certificates;
	// nil: it can.
	PodCertificates() error
}

// ExternalEnv is what the assembly lends an External it opens.
type ExternalEnv struct {
	TrustDomain spiffeid.TrustDomain
	// Backdate is Backend.Backdate: how far before now leaves start,
	// unless the backend's own configuration says otherwise.
	Backdate time.Duration
	// LocalKubeconfig is the local cluster's (Clusters.LocalKubeconfig;
	// empty: in-cluster).
	LocalKubeconfig string
	// Roots is the trust bundle in service, read at every request once
	// the assembly is built; nil before.
	Roots func() []*x509.Certificate
	// Health hears of the backend's health besides its answers to
	// signing requests (a login that lapsed, say).
	Health Health
	// Registerer takes the backend's own metrics.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Health is told how an external backend fares between requests; readiness
// (the "signer" check) reads it.
type Health interface {
	// Worked says the backend answered.
	Worked()
	// Failed says it cannot answer now, and why.
	Failed(err error)
	// Reason says why it fails, while it does; otherwise it is no news.
	Reason(err error)
}

// Opened is an External, built.
type Opened struct {
	Signer signer.Signer
	// Remote: the backend is a service meshca reaches over the network,
	// whose health readiness follows; Probe, when set, asks it cheaply
	// when nothing else has told for a while.
	Remote bool
	Probe  func(context.Context) error
	// Runners keep the backend alive (a login loop); Parts.Run runs them.
	Runners []func(context.Context) error
	// CA is the backend's CA when meshca holds its key in process: meshca
	// then issues its own serving certificate with it. Nil: the operator
	// gives one (Backend.Serving). CAFlag names the setting that gave it,
	// for errors.
	CA     *keymgr.Authority
	CAFlag string
}
