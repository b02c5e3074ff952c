package serve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// servingExpiryWarning: the serving certificate is close to expiry, and
// readiness says so, once less than this share of its lifetime is left.
// cert-manager renews at two thirds by default, meshca's own at two
// thirds too: by then one of them has missed half its window.
const servingExpiryWarning = 1.0 / 6

// followServing serves the operator's certificate in c's files, followed
// as its owner renews them (keymgr.ServingFiles): a pair that verifies to
// the trust bundle be serves is put in service at the next look, any other
// is refused, logged and counted, and the last good one keeps serving. The
// first pair must serve.
func (be *backend) followServing(c Backend, td spiffeid.TrustDomain, reg prometheus.Registerer, log *slog.Logger) error {
	f := &keymgr.ServingFiles{CertFile: c.ServingCertFile, KeyFile: c.ServingKeyFile, Roots: be.roots(td)}
	if _, err := f.Reload(); err != nil {
		return &FieldError{Field: "serving-cert-file", Err: err}
	}
	m := keymgrprom.NewServingReloads(reg, func() bool { return f.Refused() != nil })
	log.Info("serving certificate loaded", servingAttrs(c.ServingCertFile, f.Current().Leaf)...)
	f.OnReload = func(cert *tls.Certificate) {
		m.Reloaded()
		log.Info("serving certificate reloaded", servingAttrs(c.ServingCertFile, cert.Leaf)...)
	}
	f.OnError = func(err error) {
		reason := keymgr.ServingUnreadable
		if fe := (*keymgr.ServingFileError)(nil); errors.As(err, &fe) {
			reason = fe.Reason
		}
		m.Refused(reason)
		cur := f.Current().Leaf
		log.Error("serving certificate not reloaded: the last good one keeps serving", "reason", reason, "error", err,
			"serving_serial", fmt.Sprintf("%x", cur.SerialNumber), "serving_not_after", cur.NotAfter)
	}
	be.getCert, be.servingFiles = f.GetCertificate, f
	be.runners = append(be.runners, f.Run)
	return nil
}

// servingAttrs are the log attributes of a serving certificate.
func servingAttrs(file string, leaf *x509.Certificate) []any {
	names := append([]string(nil), leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		names = append(names, ip.String())
	}
	return []any{"file", file, "serial", fmt.Sprintf("%x", leaf.SerialNumber), "issuer", leaf.Issuer.String(),
		"names", strings.Join(names, ","), "not_before", leaf.NotBefore, "not_after", leaf.NotAfter}
}

// servingLeaf is the serving certificate new handshakes get; nil before
// there is one.
func (be *backend) servingLeaf() *x509.Certificate {
	if be.getCert == nil {
		return nil
	}
	c, err := be.getCert(nil)
	if err != nil || c == nil {
		return nil
	}
	return c.Leaf
}

// servingCheck is the serving-cert readiness check: it fails once the
// certificate new handshakes get has expired (clients refuse it), and
// says, ready still, when it is close to expiry or when its files hold a
// pair that was refused.
func servingCheck(be *backend, now func() time.Time) func() error {
	return func() error {
		leaf := be.servingLeaf()
		if leaf == nil {
			return errors.New("no serving certificate")
		}
		var notes []string
		if be.servingFiles != nil {
			if err := be.servingFiles.Refused(); err != nil {
				notes = append(notes, "its files hold a pair that is refused: "+err.Error())
			}
		}
		t, at := now(), leaf.NotAfter.UTC().Format(time.RFC3339)
		left, life := leaf.NotAfter.Sub(t), leaf.NotAfter.Sub(leaf.NotBefore)
		switch {
		case left < 0:
			return errors.New(strings.Join(append([]string{"the serving certificate expired at " + at + ": clients refuse it"}, notes...), "; "))
		case float64(left) < float64(life)*servingExpiryWarning:
			notes = append([]string{fmt.Sprintf("the serving certificate expires at %s, in %s: renew it", at, left.Round(time.Second))}, notes...)
		case len(notes) > 0:
			notes = append([]string{"serving the last good certificate, which expires at " + at}, notes...)
		}
		if len(notes) > 0 {
			return &ca.Degraded{Err: errors.New(strings.Join(notes, "; "))}
		}
		return nil
	}
}
