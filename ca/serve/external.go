package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/meshca/meshca/signer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// followExternal serves an external backend's trust bundle from a CA state
// that `meshca root` rotates (its authorities hold certificates only, the
// keys being in the backend), and wraps be.signer so that no leaf is handed
// out unless the state trusts its issuer and records it (judgedSigner).
func (be *backend) followExternal(ctx context.Context, c Backend, td spiffeid.TrustDomain, newStore storeOpener,
	reg prometheus.Registerer, log *slog.Logger) (*keymgr.ExternalTrust, error) {
	store, field, err := openState(c, newStore)
	if err != nil {
		return nil, err
	}
	tidy(ctx, store, log)
	trust := keymgr.NewExternalTrust(td, c.Rotation)
	f := be.follower(store, trust, keymgrprom.New(reg), log, nil)
	if _, err := f.Sync(ctx); err != nil {
		if errors.Is(err, keymgr.ErrNoState) {
			err = fmt.Errorf("%w: import the backend's root first: meshca root prepare --external --cert root.pem", err)
		}
		return nil, &FieldError{Field: field, Err: err}
	}
	be.bundles, be.expiry, be.signing = trust, trust, trust.Signing
	be.signer = &judgedSigner{inner: be.signer, name: be.name, trust: trust, issued: &keymgr.IssuanceLog{Store: store}, now: time.Now}
	be.runners = append(be.runners, f.Run)
	return trust, nil
}

// judgedSigner hands out an external backend's leaf only when the CA
// state trusts the authority that issued it (keymgr.ExternalTrust.Judge:
// not retired, not a prepared one before its activation is safe) and has
// recorded the leaf's lifetime under it, which the retire guard relies on.
// The leaf goes out with the authority's own path to its root, and with
// the authority's certificate as its VerifiedIssuer, Judge having checked
// the leaf's signature with it.
type judgedSigner struct {
	inner  signer.Signer
	name   string
	trust  *keymgr.ExternalTrust
	issued *keymgr.IssuanceLog
	now    func() time.Time
}

// Sign implements signer.Signer.
func (s *judgedSigner) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	resp, err := s.inner.Sign(ctx, req)
	if err != nil {
		return nil, err
	}
	rec, err := s.trust.Judge(resp.Leaf, resp.Intermediates, s.now())
	if err != nil {
		var ge *keymgr.GuardError
		if errors.As(err, &ge) {
			return nil, &signer.Error{Backend: s.name, Kind: signer.KindUnavailable, Err: err}
		}
		return nil, &signer.Error{Backend: s.name, Kind: signer.KindInternal, Err: err}
	}
	if err := s.issued.Record(ctx, rec.Cert, resp.Leaf); err != nil {
		return nil, &signer.Error{Backend: s.name, Kind: signer.KindUnavailable, Err: fmt.Errorf("recording the leaf in the CA state: %w", err)}
	}
	// The state knows the path to the root; the backend's own idea of it
	// may be stale after its key changed. Judge saw rec.Cert's key sign
	// the leaf: the server need not check that signature again.
	return &signer.Response{Leaf: resp.Leaf, Intermediates: rec.Intermediates(), VerifiedIssuer: rec.Cert}, nil
}
