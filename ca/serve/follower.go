package serve

import (
	"crypto/x509"
	"log/slog"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/keymgrprom"
)

// follower keeps target on the state in store, and tells the metrics, the
// bundle's listeners (be.onChange) and then, when set, renewed of every
// state it puts in service.
func (be *backend) follower(store keymgr.StateStore, target keymgr.Target, metrics *keymgrprom.Metrics, log *slog.Logger,
	renewed func()) *keymgr.Follower {
	return &keymgr.Follower{Store: store, Target: target,
		OnError: func(err error) {
			metrics.Unusable()
			log.Error("CA state not used", "error", err)
		},
		OnChange: func(s *keymgr.State) {
			metrics.Observe(s)
			v := &trust.BundleVersion{Lineage: s.View().Lineage(), Sequence: s.Sequence}
			if _, plugged := store.(*dirstore.PluggedDir); plugged {
				// A plugged-in directory's sequence counts the changes
				// one process has seen: not comparable across replicas.
				v.Lineage = ""
			}
			be.stateCRLs(s, *v)
			be.version.Store(v)
			be.revoked.Store(newRevokedSet(s))
			for _, f := range be.onChange {
				f()
			}
			if renewed != nil {
				renewed()
			}
			active := s.Active()
			attrs := []any{"active", active.ID(), "roots", len(s.Bundle()), "sequence", s.Sequence}
			if c := be.signingNow(); c != nil && !c.Equal(active.Cert) {
				// The active authority is held until its CRL has
				// travelled (--crl-propagation): the one it replaced signs.
				attrs = append(attrs, "signing", keymgr.Fingerprint(c))
			}
			log.Info("CA state in service", attrs...)
		}}
}

// signingNow is the certificate that signs now, when meshca signs.
func (be *backend) signingNow() *x509.Certificate {
	if be.signing == nil {
		return nil
	}
	return be.signing()
}
