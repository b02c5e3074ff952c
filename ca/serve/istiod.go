package serve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/keymgr"
)

// IstiodCertLease is the Lease the replicas elect the keeper of istiod's
// certificate on.
const IstiodCertLease = "meshca-istiod-cert"

// IstiodCert configures the keeper of istiod's serving certificate
// (ca/istiodcert); off when Secret is empty.
type IstiodCert struct {
	// Secret is namespace/name, in the local cluster: istiod-tls in
	// istiod's namespace, which its chart mounts.
	Secret string
	// DNSNames are the certificate's names; required when Secret is set
	// (cmd gives istiod.<namespace>.svc, and istiod-<revision>.<namespace>.svc
	// for a revision).
	DNSNames []string
	// TTL is its lifetime; istiodcert.DefaultTTL when zero.
	TTL time.Duration
	// Deployment, when set, is istiod's Deployment in the Secret's
	// namespace, restarted when the roots grow (istiodcert.Config).
	Deployment string
}

// split returns Secret's namespace and name.
func (c IstiodCert) split() (string, string, error) {
	ns, name, ok := strings.Cut(c.Secret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", &FieldError{Field: "istiod-cert-secret", Err: fmt.Errorf("%q: want namespace/name", c.Secret)}
	}
	return ns, name, nil
}

// check refuses a Secret that is a CA's (the state's, Istio's), and a
// backend that cannot issue istiod's certificate, or is not told how to
// (External.IstiodCert); the built-in CA always can.
func (c IstiodCert) check(b Backend) error {
	if c.Secret == "" {
		return nil
	}
	if _, _, err := c.split(); err != nil {
		return err
	}
	if err := istiodcert.CheckSecretName(c.Secret, b.StateSecret); err != nil {
		return &FieldError{Field: "istiod-cert-secret", Err: err}
	}
	if len(c.DNSNames) == 0 {
		return &FieldError{Field: "istiod-cert-dns-names", Err: errors.New("istiod's certificate needs at least one DNS name")}
	}
	if b.External == nil {
		return nil
	}
	return b.External.IstiodCert()
}

// IstiodCertOwner is the keeper's mark (istiodcert.AnnotationOwner) of
// the meshca whose replicas elect it on IstiodCertLease in leaseNS.
func IstiodCertOwner(leaseNS string) string { return leaseNS + "/" + IstiodCertLease }

// newIstiodRunner builds the keeper of istiod's certificate, issuing
// through srv, and returns it elected on IstiodCertLease in leaseNS, and
// its readiness check. The keeper looks again whenever the CA state in
// service changes (be.onChange), and automatic rotation reads the Secret
// before every step it could break (keymgr.Dependent).
func newIstiodRunner(c IstiodCert, td spiffeid.TrustDomain, client kubernetes.Interface, be *backend, srv *ca.Server,
	leaseNS string, reg prometheus.Registerer, leaders *leaderprom.Metrics, log *slog.Logger) (func(context.Context) error, ca.ReadyCheck, error) {
	ns, name, err := c.split()
	if err != nil {
		return nil, ca.ReadyCheck{}, err
	}
	switch {
	case client == nil:
		return nil, ca.ReadyCheck{}, &FieldError{Field: "istiod-cert-secret", Err: errors.New("needs the local cluster")}
	case leaseNS == "":
		return nil, ca.ReadyCheck{}, &FieldError{Field: "trust-lease-namespace", Err: errors.New("the keeper of istiod's certificate needs the namespace of its Lease")}
	}
	bundle := func() []*x509.Certificate {
		b, err := be.bundles.GetX509BundleForTrustDomain(td)
		if err != nil {
			return nil
		}
		return b.X509Authorities()
	}
	k, err := istiodcert.New(istiodcert.Config{Client: client, Namespace: ns, Name: name, Owner: IstiodCertOwner(leaseNS),
		Names: c.DNSNames, TTL: c.TTL, Deployment: c.Deployment, Issuer: ca.NewDNSIssuer(srv), Bundle: bundle, Signing: be.signing,
		Observe: newIstiodMetrics(reg), Logger: log.With("part", "istiod-cert")})
	if err != nil {
		return nil, ca.ReadyCheck{}, &FieldError{Field: "istiod-cert-secret", Err: err}
	}
	be.onChange = append(be.onChange, k.Changed)
	if be.rotator != nil {
		be.rotator.Dependents = func(ctx context.Context) []keymgr.Dependent {
			return []keymgr.Dependent{istiodcert.Read(ctx, client, ns, name)}
		}
	}
	run := func(ctx context.Context) error {
		return campaign(ctx, client, leaseNS, IstiodCertLease, k.Run, leaders, log)
	}
	return run, ca.ReadyCheck{Name: "istiod-cert", Check: istiodReady(k)}, nil
}

// istiodReady is the istiod-cert check: on the replica that keeps the
// Secret, a Secret of another owner shows on its ok line. It is a
// degradation, not unreadiness: workloads' certificates do not depend on
// it, and a replica taken out for it would only move the keeper.
func istiodReady(k *istiodcert.Keeper) func() error {
	return func() error {
		if err := k.Refusal(); err != nil {
			return &ca.Degraded{Err: err}
		}
		return nil
	}
}

// istiodMetrics counts the keeper's writes and shows its certificate's
// expiry and its refusal of another owner's Secret.
type istiodMetrics struct {
	writes   *prometheus.CounterVec
	notAfter prometheus.Gauge
	restarts prometheus.Counter
	refused  *prometheus.GaugeVec
}

func newIstiodMetrics(reg prometheus.Registerer) *istiodMetrics {
	m := &istiodMetrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_istiod_certificate_writes_total",
			Help: "Writes of istiod's certificate Secret by reason (missing, key_mismatch, names_changed, roots_changed, " +
				"authority_changed, untrusted, renewal, deployment_changed, adopted, owner_mark) and result (written, failed).",
		}, []string{"reason", "result"}),
		notAfter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_istiod_certificate_expiry_timestamp_seconds",
			Help: "When the istiod certificate this replica last wrote expires (Unix seconds); 0 before it wrote one.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshca_istiod_restarts_total",
			Help: "Restarts of istiod's Deployment (--istiod-deployment) to load roots its ca.crt gained, which istiod reads only when it starts.",
		}),
		refused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_istiod_certificate_refused",
			Help: "1 while the keeper of istiod's certificate (on the replica holding its Lease) leaves the Secret alone because another owner " +
				"has it, by reason (ca_key, cert_manager, owner_reference, other_meshca, managed_by, unmarked); 0 otherwise.",
		}, []string{"reason"}),
	}
	for _, r := range istiodcert.RefusalReasons {
		m.refused.WithLabelValues(r).Set(0)
	}
	reg.MustRegister(m.writes, m.notAfter, m.restarts, m.refused)
	return m
}

// Refused implements istiodcert.Observer.
func (m *istiodMetrics) Refused(reason string) {
	for _, r := range istiodcert.RefusalReasons {
		v := 0.0
		if r == reason {
			v = 1
		}
		m.refused.WithLabelValues(r).Set(v)
	}
}

// Written implements istiodcert.Observer.
func (m *istiodMetrics) Written(reason string, notAfter time.Time) {
	m.writes.WithLabelValues(reason, "written").Inc()
	m.notAfter.Set(float64(notAfter.Unix()))
}

// Restarted implements istiodcert.Observer.
func (m *istiodMetrics) Restarted() { m.restarts.Inc() }

// Failed implements istiodcert.Observer.
func (m *istiodMetrics) Failed(reason string) { m.writes.WithLabelValues(reason, "failed").Inc() }
