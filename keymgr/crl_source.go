package keymgr

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"time"
)

// The CRLs of CAs whose key an upstream keeps and whose CRLs it makes
// itself (upstream.CRLSource: a Vault PKI issuer over meshca's
// intermediate). The CRL is the upstream's, with its own number, validity
// and entries; meshca has the upstream revoke what the state revokes by
// that CA first, and stores the CRL once it lists all of it.

// sourced reports whether is's CRL comes from k.Source.
func (k *CRLKeeper) sourced(is CRLIssuer) bool {
	return k.Source != nil && is.Key == nil && is.Upstream.Type != "" && is.Upstream.Type == k.UpstreamName
}

// due is why is's CRL must be fetched or issued at now, or "": as
// View.CRLDue, but a CRL from the upstream need only list every
// revocation of the state (it may list more: the upstream's own).
func (k *CRLKeeper) due(v View, is CRLIssuer, now time.Time) string {
	if !k.sourced(is) {
		return v.CRLDue(is, now, k.refreshAt())
	}
	rec, ok := v.CRL(is.ID)
	switch {
	case !ok:
		return "it has no CRL yet"
	case !listsAll(rec.DER, v.CRLEntries(is, now)):
		return "the revocations changed"
	case !now.Before(refreshPoint(rec, k.refreshAt())):
		return fmt.Sprintf("%.0f%% of its validity has passed", 100*k.refreshAt())
	}
	return ""
}

// fromSource has the upstream revoke what the state revokes by is and
// is not on its CRL yet, and returns the CRL it then makes.
func (k *CRLKeeper) fromSource(ctx context.Context, v View, is CRLIssuer, now time.Time) (CRLRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, cmpOr(k.Timeout, DefaultRenewTimeout))
	defer cancel()
	der, err := k.Source.CRL(ctx, is.Cert, is.Upstream)
	if err != nil {
		return CRLRecord{}, err
	}
	missing := unlisted(der, v.CRLEntries(is, now))
	for _, e := range missing {
		c := v.caSignedBy(is.Cert, e)
		if c == nil {
			return CRLRecord{}, fmt.Errorf("serial %s is revoked in the CA state but not on upstream %s's CRL, and the state no longer holds its certificate to revoke it there: revoke it in %s", serialText(e.SerialNumber), is.Upstream.Type, is.Upstream.Type)
		}
		if err := k.Source.Revoke(ctx, c, is.Upstream); err != nil {
			return CRLRecord{}, err
		}
	}
	if len(missing) > 0 {
		if der, err = k.Source.CRL(ctx, is.Cert, is.Upstream); err != nil {
			return CRLRecord{}, err
		}
		if left := unlisted(der, v.CRLEntries(is, now)); len(left) > 0 {
			return CRLRecord{}, fmt.Errorf("upstream %s revoked serial %s but its CRL does not list it yet", is.Upstream.Type, serialText(left[0].SerialNumber))
		}
	}
	l, err := x509.ParseRevocationList(der)
	if err != nil {
		return CRLRecord{}, fmt.Errorf("the upstream's CRL does not parse: %w", err)
	}
	if err := l.CheckSignatureFrom(is.Cert); err != nil {
		return CRLRecord{}, fmt.Errorf("the upstream's CRL is not signed by its issuer: %w", err)
	}
	return NewCRLRecord(is.ID, der)
}

// unlisted are the entries of want whose serial the CRL der does not
// list (all of them when it does not parse).
func unlisted(der []byte, want []x509.RevocationListEntry) []x509.RevocationListEntry {
	l, err := x509.ParseRevocationList(der)
	if err != nil {
		return want
	}
	var out []x509.RevocationListEntry
	for _, w := range want {
		if !slices.ContainsFunc(l.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(w.SerialNumber) == 0 }) {
			out = append(out, w)
		}
	}
	return out
}

// listsAll reports whether the CRL der lists every serial of want.
func listsAll(der []byte, want []x509.RevocationListEntry) bool { return len(unlisted(der, want)) == 0 }

// caSignedBy is the CA certificate of the state with e's serial that
// issuer signed, nil when the state holds none.
func (v View) caSignedBy(issuer *x509.Certificate, e x509.RevocationListEntry) *x509.Certificate {
	for _, a := range v.State.Authorities {
		if a == nil || a.Cert == nil {
			continue
		}
		for _, c := range append([]*x509.Certificate{a.Cert}, a.Chain...) {
			if c.SerialNumber.Cmp(e.SerialNumber) == 0 && c.CheckSignatureFrom(issuer) == nil {
				return c
			}
		}
	}
	return nil
}
