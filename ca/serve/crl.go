package serve

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/meshca/meshca/keymgr/upstream"
)

// CRL keeps a CRL in the CA state for every CA of it that signs
// (keymgr.CRLKeeper), on the replica elected to take rotation steps:
// Backend.CRL; nil: off. Only with the built-in CA and a CA state.
type CRL struct {
	// Validity of a CRL, RefreshAt the fraction of it after which it is
	// reissued, Interval how often the keeper looks: the keymgr.CRLKeeper
	// defaults when zero.
	Validity  time.Duration
	RefreshAt float64
	Interval  time.Duration
	// Propagation is how long a CRL takes to reach every verifier: a new
	// signing authority signs only this long after it was stored with its
	// first CRL (keymgr.Manager.HoldNew); zero: at once.
	Propagation time.Duration
}

// crlKeeper is the keeper of the CRLs in store, signing those of roots
// kept in ren's upstream there, wired into metrics, the log and the
// follower f (which serves a new CRL at once, and pokes the keeper when
// the state changes: a revocation is on the CRL within a follow interval
// rather than the keeper's); nil when c.CRL is.
func (c Backend) crlKeeper(be *backend, store keymgr.StateStore, ren *keymgr.Renewer, f *keymgr.Follower, metrics *keymgrprom.Metrics,
	log *slog.Logger) func(context.Context) error {
	if c.CRL == nil {
		return nil
	}
	k := &keymgr.CRLKeeper{Store: store, Validity: c.CRL.Validity, RefreshAt: c.CRL.RefreshAt, Interval: c.CRL.Interval}
	be.onChange = append(be.onChange, k.Poke)
	if ren != nil {
		ren.CRLs = k // a renewal is stored with its first CRL
		k.Upstream, _ = ren.Upstream.(upstream.CRLSigner)
		k.Source, _ = ren.Upstream.(upstream.CRLSource)
		k.UpstreamName = ren.Name
	}
	k.OnIssued = func(is keymgr.CRLIssued) {
		metrics.CRLIssued(keymgrprom.CRLIssuedOK)
		c.audit.Audit(context.Background(), &ca.AuditEvent{Event: ca.EventCRL, Decision: ca.DecisionIssued, Source: ca.SourceAuto,
			Caller: "meshca", Issuer: is.Issuer, CRLNumber: is.Number.String(), Entries: is.Entries, NotAfter: is.NextUpdate,
			Reason: is.Why})
		log.Info("CRL issued", "issuer", is.Issuer, "subject", is.Subject, "number", is.Number, "entries", is.Entries,
			"next_update", is.NextUpdate, "why", is.Why)
		if _, err := f.Sync(context.Background()); err != nil {
			log.Error("CA state not used", "error", err)
		}
	}
	k.OnFailed = func(*keymgr.CRLError) { metrics.CRLIssued(keymgrprom.CRLIssuedError) }
	k.OnError = func(err error) {
		var ce *keymgr.CRLError
		if errors.As(err, &ce) {
			c.audit.Audit(context.Background(), &ca.AuditEvent{Event: ca.EventCRL, Decision: ca.DecisionRefused,
				Source: ca.SourceAuto, Caller: "meshca", Issuer: ce.Issuer, Detail: err.Error()})
			log.Error("CRL not issued; the last one stays published until its nextUpdate", "error", err)
			return
		}
		log.Error("CRLs not kept", "error", err)
	}
	return k.Run
}
