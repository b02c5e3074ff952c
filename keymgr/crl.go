package keymgr

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/keymgr/upstream"
)

// The CRLs of a CA state. A verifier that checks revocation for the whole
// chain (ztunnel: rustls-webpki with its defaults) refuses a certificate
// whose issuer has no CRL in the file it was given, so once one CRL is
// published every CA that may sign what a peer presents needs its own:
// the certificate that signs leaves, each intermediate above it, and the
// root that signs the top one, of every authority that is trusted
// (prepared, active or previous). A prepared authority's CRL is thus made
// before it signs anything, and a retired one's is dropped with it.

// CRLIssuer is a CA of the state that needs a CRL.
type CRLIssuer struct {
	// ID is Cert's fingerprint: the Issuer of its revocations and CRL.
	ID   string
	Cert *x509.Certificate
	// SignsLeaves: some authority's signing certificate (Issuer ""
	// revocations are listed on its CRL).
	SignsLeaves bool
	// Key is Cert's private key when the CA state holds it (an
	// authority's Key, or the self upstream's RootKey); else Upstream
	// names where it is (a renewed authority's root); neither: meshca
	// cannot sign its CRL.
	Key      crypto.Signer
	Upstream upstream.Ref
}

// CRLIssuers lists the CAs of the state that need a CRL, oldest
// authority first, each once.
func (v View) CRLIssuers() []CRLIssuer {
	var out []CRLIssuer
	index := map[string]int{}
	add := func(is CRLIssuer) {
		i, seen := index[is.ID]
		if !seen {
			index[is.ID] = len(out)
			out = append(out, is)
			return
		}
		o := &out[i]
		o.SignsLeaves = o.SignsLeaves || is.SignsLeaves
		if o.Key == nil {
			o.Key = is.Key
		}
		if o.Upstream.Type == "" {
			o.Upstream = is.Upstream
		}
	}
	for _, a := range v.State.Authorities {
		if a == nil || a.Cert == nil || a.Phase == PhaseRetired {
			continue
		}
		add(CRLIssuer{ID: a.ID(), Cert: a.Cert, SignsLeaves: true, Key: a.Key})
		for _, c := range a.Chain {
			is := CRLIssuer{ID: Fingerprint(c), Cert: c}
			if a.Renewed() {
				is.Upstream = a.Upstream
			}
			add(is)
		}
		if !a.SignsWithRoot() {
			is := CRLIssuer{ID: a.RootID(), Cert: a.Root, Key: a.RootKey}
			if a.Renewed() && a.RootKey == nil {
				is.Upstream = a.Upstream
			}
			add(is)
		}
	}
	return out
}

// Problem is why meshca cannot sign is's CRL, or "": its certificate
// lacks the cRLSign key usage or a subject key identifier, or neither
// the state nor an upstream holds its key.
func (is CRLIssuer) Problem() string {
	switch {
	case is.Cert.KeyUsage&x509.KeyUsageCRLSign == 0:
		return "its certificate lacks the cRLSign key usage: it cannot sign a CRL, and no verifier would take one"
	case len(is.Cert.SubjectKeyId) == 0:
		return "its certificate has no subject key identifier, which the CRL's authority key identifier must name"
	case is.Key == nil && is.Upstream.Type == "":
		return "meshca holds no key of it, and no upstream does: its CRL must come from where its key is"
	}
	return ""
}

// CRLProblems names each CA of the state that needs a CRL and that meshca
// cannot sign one for, and why: `meshca root status` shows them. While
// any is listed, a verifier that checks the whole chain refuses what that
// CA signed once CRLs are published.
func (v View) CRLProblems() []string {
	var out []string
	for _, is := range v.CRLIssuers() {
		if why := is.Problem(); why != "" {
			out = append(out, fmt.Sprintf("%.16s (%s): %s", is.ID, is.Cert.Subject, why))
		}
	}
	return out
}

// crlMissing is why rec may not sign yet while the state keeps CRLs: a
// CA of its chain (its signing certificate, an intermediate above it, its
// root) that needs a CRL has none in the state, and a verifier checking
// the whole chain against the published file would refuse its first
// certificates (unknown revocation status). "" when the state keeps no
// CRL, or every such CA has one (a CA meshca cannot sign a CRL for is
// not waited for: root status names it).
func (v View) crlMissing(rec *AuthorityRecord) string {
	if len(v.State.CRLs) == 0 {
		return ""
	}
	mine := append([]*x509.Certificate{rec.Cert, rec.Root}, rec.Chain...)
	for _, is := range v.CRLIssuers() {
		if _, ok := v.CRL(is.ID); ok || is.Problem() != "" || !slices.ContainsFunc(mine, is.Cert.Equal) {
			continue
		}
		return fmt.Sprintf("no CRL of its CA %.16s (%s) is in the CA state yet: once published, a verifier that checks the whole chain would refuse what it signs", is.ID, is.Cert.Subject)
	}
	return ""
}

// crlIssuer is the issuer id of the state, if it needs a CRL.
func (v View) crlIssuer(id string) (CRLIssuer, bool) {
	for _, is := range v.CRLIssuers() {
		if is.ID == id {
			return is, true
		}
	}
	return CRLIssuer{}, false
}

// CRLEntries are the entries of is's CRL at now: the revocations by is
// that have not expired, and, when it signs leaves, those of an unknown
// issuer; by serial.
func (v View) CRLEntries(is CRLIssuer, now time.Time) []x509.RevocationListEntry {
	var out []x509.RevocationListEntry
	seen := map[string]bool{}
	for _, r := range v.State.Revocations {
		if r.Expired(now) || !(r.Issuer == is.ID || r.Issuer == "" && is.SignsLeaves) || seen[r.Serial.Text(16)] {
			continue
		}
		seen[r.Serial.Text(16)] = true
		e := x509.RevocationListEntry{SerialNumber: new(big.Int).Set(r.Serial), RevocationTime: r.RevokedAt.UTC().Truncate(time.Second)}
		if r.Reason != 0 {
			e.ReasonCode = r.Reason
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b x509.RevocationListEntry) int { return a.SerialNumber.Cmp(b.SerialNumber) })
	return out
}

// sameEntries reports whether the CRL der lists exactly want (serial,
// reason and time to the second).
func sameEntries(der []byte, want []x509.RevocationListEntry) bool {
	l, err := x509.ParseRevocationList(der)
	if err != nil || len(l.RevokedCertificateEntries) != len(want) {
		return false
	}
	got := slices.Clone(l.RevokedCertificateEntries)
	slices.SortFunc(got, func(a, b x509.RevocationListEntry) int { return a.SerialNumber.Cmp(b.SerialNumber) })
	for i, w := range want {
		g := got[i]
		if g.SerialNumber.Cmp(w.SerialNumber) != 0 || g.ReasonCode != w.ReasonCode || !g.RevocationTime.Equal(w.RevocationTime) {
			return false
		}
	}
	return true
}

// CRLDue says why is's CRL must be (re)issued at now, or "": it has
// none, its entries are not the state's revocations, or refreshAt (a
// fraction in (0, 1)) of its validity has passed.
func (v View) CRLDue(is CRLIssuer, now time.Time, refreshAt float64) string {
	rec, ok := v.CRL(is.ID)
	switch {
	case !ok:
		return "it has no CRL yet"
	case !sameEntries(rec.DER, v.CRLEntries(is, now)):
		return "the revocations changed"
	case !now.Before(refreshPoint(rec, refreshAt)):
		return fmt.Sprintf("%.0f%% of its validity has passed", 100*refreshAt)
	}
	return ""
}

// refreshPoint is when refreshAt of rec's validity has passed.
func refreshPoint(rec CRLRecord, refreshAt float64) time.Time {
	return rec.ThisUpdate.Add(time.Duration(refreshAt * float64(rec.NextUpdate.Sub(rec.ThisUpdate))))
}

// CRLTemplate is the template of is's next CRL at now: its entries, the
// number after the last one's, thisUpdate backdated, nextUpdate validity
// from now; both to the second.
func (v View) CRLTemplate(is CRLIssuer, now time.Time, backdate, validity time.Duration) *x509.RevocationList {
	number := big.NewInt(1)
	if rec, ok := v.CRL(is.ID); ok {
		number.Add(rec.Number, number)
	}
	return &x509.RevocationList{
		Number:                    number,
		ThisUpdate:                now.Add(-backdate).UTC().Truncate(time.Second),
		NextUpdate:                now.Add(validity).UTC().Truncate(time.Second),
		RevokedCertificateEntries: v.CRLEntries(is, now),
	}
}

// PutCRL stores rec as the CRL of its issuer, if its number is higher
// than the stored one's: a CRL number only grows. It reports whether it
// stored it.
func (s *State) PutCRL(rec CRLRecord) bool {
	i := slices.IndexFunc(s.CRLs, func(c CRLRecord) bool { return c.Issuer == rec.Issuer })
	if i < 0 {
		s.CRLs = append(s.CRLs, rec)
		return true
	}
	if rec.Number.Cmp(s.CRLs[i].Number) <= 0 {
		return false
	}
	s.CRLs = slices.Clone(s.CRLs)
	s.CRLs[i] = rec
	return true
}

// PruneCRLs drops the CRLs of CAs that no longer need one (their
// authorities retired, or gone), and returns how many.
func (s *State) PruneCRLs() int {
	need := map[string]bool{}
	for _, is := range s.View().CRLIssuers() {
		need[is.ID] = true
	}
	kept := slices.DeleteFunc(slices.Clone(s.CRLs), func(c CRLRecord) bool { return !need[c.Issuer] })
	n := len(s.CRLs) - len(kept)
	if n > 0 {
		s.CRLs = kept
	}
	return n
}

// revokeRule is why Revoke refuses to list a revocation by issuer in
// s, or "": it must be a CA whose CRL meshca can sign.
func (v View) revokeRule(issuer string) string {
	if issuer == "" {
		return ""
	}
	is, ok := v.crlIssuer(issuer)
	if !ok {
		return "no CA of the state that is not retired has this fingerprint"
	}
	if why := is.Problem(); why != "" {
		return fmt.Sprintf("meshca cannot publish a CRL of %q: %s", is.Cert.Subject, strings.TrimSuffix(why, "."))
	}
	return ""
}
