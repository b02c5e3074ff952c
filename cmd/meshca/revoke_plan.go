package main

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// What meshca revoke revokes, worked out from its flags, the CA state
// and the audit log before anything changes.

// crlReasons are the RFC 5280 CRLReason codes the CLI takes, by name.
var crlReasons = map[string]int{
	"unspecified": 0, "keycompromise": 1, "cacompromise": 2, "affiliationchanged": 3,
	"superseded": 4, "cessationofoperation": 5,
}

// reasonNames is the help's list of crlReasons.
const reasonNames = "keyCompromise, caCompromise (an intermediate only), affiliationChanged, superseded, cessationOfOperation or unspecified"

// parseReason is the code of the reason name; caCompromise only for a
// CA certificate.
func parseReason(name string, ca bool) (int, error) {
	code, ok := crlReasons[strings.ToLower(strings.TrimSpace(name))]
	switch {
	case name == "":
		return 0, fmt.Errorf("--reason is required: one of %s", reasonNames)
	case !ok:
		return 0, fmt.Errorf("--reason %q: want one of %s", name, reasonNames)
	case code == 2 && !ca:
		return 0, errors.New("--reason caCompromise is the reason of a CA certificate (--intermediate): use keyCompromise for a leaf")
	}
	return code, nil
}

// parseSerial reads a serial number: hex as meshca's audit log, meshca
// root status and openssl x509 -serial write it (with or without 0x or
// colons), or decimal. "hex:" and "dec:" say which; digits alone may be
// either, and both readings are returned (one when they agree).
func parseSerial(s string) ([]*big.Int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	read := func(digits string, base int) ([]*big.Int, error) {
		n, ok := new(big.Int).SetString(digits, base)
		if !ok || n.Sign() <= 0 {
			return nil, fmt.Errorf("--serial %q is not a positive hex or decimal number", s)
		}
		return []*big.Int{n}, nil
	}
	switch {
	case strings.HasPrefix(t, "dec:"):
		return read(t[4:], 10)
	case strings.HasPrefix(t, "hex:"):
		return read(strings.ReplaceAll(t[4:], ":", ""), 16)
	case strings.HasPrefix(t, "0x"):
		return read(t[2:], 16)
	case strings.Contains(t, ":") || strings.ContainsAny(t, "abcdef"):
		return read(strings.ReplaceAll(t, ":", ""), 16)
	}
	hex, err := read(t, 16)
	if err != nil {
		return nil, err
	}
	dec, err := read(t, 10)
	if err != nil || dec[0].Cmp(hex[0]) == 0 {
		return hex, nil
	}
	return append(hex, dec[0]), nil
}

// ambiguous is the error of digits that name two serials.
func ambiguous(s string) error {
	return fmt.Errorf("--serial %s may be hex or decimal: write hex:%s or dec:%s", s, s, s)
}

// liveCAs are the CA certificates of the authorities of s that are not
// retired, by ID: the issuers a revocation may name.
func liveCAs(s *keymgr.State) map[string]*x509.Certificate {
	out := map[string]*x509.Certificate{}
	for _, a := range s.Authorities {
		if a == nil || a.Phase == keymgr.PhaseRetired || a.Cert == nil {
			continue
		}
		for _, c := range append(append([]*x509.Certificate{a.Cert}, a.Chain...), a.Root) {
			out[keymgr.Fingerprint(c)] = c
		}
	}
	return out
}

// resolveCA is the live CA of s whose ID starts with prefix.
func resolveCA(s *keymgr.State, prefix string) (string, *x509.Certificate, error) {
	p := strings.ToLower(strings.TrimSpace(prefix))
	if len(p) < keymgr.MinIDPrefix || strings.Trim(p, "0123456789abcdef") != "" {
		return "", nil, fmt.Errorf("--issuer %q: give at least %d hex digits of the CA's id (meshca root status lists them)", prefix, keymgr.MinIDPrefix)
	}
	var ids []string
	for id := range liveCAs(s) {
		if strings.HasPrefix(id, p) {
			ids = append(ids, id)
		}
	}
	switch len(ids) {
	case 0:
		return "", nil, fmt.Errorf("--issuer %s: no CA of the CA state that is not retired has this id (meshca root status lists them)", prefix)
	case 1:
		return ids[0], liveCAs(s)[ids[0]], nil
	}
	return "", nil, fmt.Errorf("--issuer %s: %d CAs have an id starting so: give more digits", prefix, len(ids))
}

// signsCRLs refuses a CA certificate that may not sign a CRL: a verifier
// (ztunnel's webpki) rejects a CRL of an issuer without cRLSign.
func signsCRLs(id string, c *x509.Certificate) error {
	if c.KeyUsage&x509.KeyUsageCRLSign == 0 {
		return fmt.Errorf("CA %.16s (%s) may not sign CRLs (its certificate lacks the cRLSign key usage): no CRL of it can list a revocation; "+
			"replace it (meshca root prepare) and retire it instead", id, c.Subject)
	}
	return nil
}

// issuerOfIntermediate is the CA certificate of rec's chain that signed
// its intermediate: the next one up, or its root.
func issuerOfIntermediate(rec *keymgr.AuthorityRecord) *x509.Certificate {
	for _, c := range rec.Chain {
		if bytes.Equal(rec.Cert.RawIssuer, c.RawSubject) && rec.Cert.CheckSignatureFrom(c) == nil {
			return c
		}
	}
	return rec.Root
}

// planIntermediate is the revocation of the signing intermediate of the
// authority idOrPrefix names: refused for a root, a retired authority
// whose leaves have all expired or whose root left the bundle, an issuer
// that cannot sign CRLs and, without force, the active authority. A
// retired one (by force, after a leak) whose root is still trusted is
// revoked on that root's CRL: its leaves still chain to the root.
func planIntermediate(s *keymgr.State, idOrPrefix string, force bool, now time.Time) (keymgr.Revocation, error) {
	rec, err := s.View().Lookup(idOrPrefix)
	if err != nil {
		return keymgr.Revocation{}, &exitError{code: exitUsage, err: err}
	}
	refused := func(err error) (keymgr.Revocation, error) {
		return keymgr.Revocation{}, &exitError{code: exitRefused, err: err}
	}
	switch {
	case rec.Cert.Equal(rec.Root):
		return refused(fmt.Errorf("authority %s signs with its root: no CRL revokes a root; rotate it away (meshca root prepare, activate, retire)", shortID(rec)))
	case rec.Phase == keymgr.PhaseRetired && (!trusted(s, rec.Root) || !now.Before(rec.LatestLeafNotAfter)):
		return refused(fmt.Errorf("authority %s is retired: every leaf it signed has expired, or its root is no longer trusted", shortID(rec)))
	case rec.Phase == keymgr.PhaseActive && !force:
		return refused(fmt.Errorf("authority %s is the active one: once its intermediate is revoked, every certificate it signs is refused; "+
			"make another authority active first (meshca root prepare, activate), or give --force", shortID(rec)))
	}
	issuer := issuerOfIntermediate(rec)
	id := keymgr.Fingerprint(issuer)
	if err := signsCRLs(id, issuer); err != nil {
		return refused(err)
	}
	return keymgr.Revocation{Serial: rec.Cert.SerialNumber, Issuer: id, NotAfter: rec.Cert.NotAfter, Subject: rec.Cert.Subject.String()}, nil
}

// planSerial is the revocation of serial: its issuer and NotAfter from
// the audit log's events found, else from issuer and notAfter.
func planSerial(s *keymgr.State, serial *big.Int, found []*issuance, issuer string, notAfter time.Time) ([]keymgr.Revocation, error) {
	var id string
	if issuer != "" {
		var c *x509.Certificate
		var err error
		if id, c, err = resolveCA(s, issuer); err != nil {
			return nil, err
		}
		if err := signsCRLs(id, c); err != nil {
			return nil, err
		}
		found = slices.DeleteFunc(slices.Clone(found), func(c *issuance) bool { return c.Issuer != "" && c.Issuer != id })
	}
	if len(found) == 0 {
		return []keymgr.Revocation{{Serial: serial, Issuer: id, NotAfter: notAfter}}, nil
	}
	var out []keymgr.Revocation
	for _, c := range found {
		r := keymgr.Revocation{Serial: serial, Issuer: c.Issuer, NotAfter: c.NotAfter, Subject: c.Identity}
		if r.Issuer == "" {
			r.Issuer = id
		}
		if err := retiredIssuer(s, r); err != nil {
			return nil, err
		}
		if r.Issuer != "" {
			if ca := liveCAs(s)[r.Issuer]; ca != nil {
				if err := signsCRLs(r.Issuer, ca); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// planNode is the revocation of every certificate in found issued
// through node's proxy since since and still valid at now.
func planNode(node string, since, now time.Time, found []*issuance) []keymgr.Revocation {
	var out []keymgr.Revocation
	for _, c := range found {
		if !c.throughNode(node) || c.Time.Before(since) || !c.NotAfter.After(now) {
			continue
		}
		out = append(out, keymgr.Revocation{Serial: c.Serial, Issuer: c.Issuer, NotAfter: c.NotAfter, Subject: c.Identity, Node: node})
	}
	return out
}

// liveOnly splits rs into those whose issuer is a live CA of s (or
// unknown) and those whose issuer was retired meanwhile: a retired
// authority's leaves have all expired (its guard), nothing to revoke.
func liveOnly(s *keymgr.State, rs []keymgr.Revocation) (live, gone []keymgr.Revocation) {
	cas := liveCAs(s)
	for _, r := range rs {
		if r.Issuer != "" && cas[r.Issuer] == nil {
			gone = append(gone, r)
			continue
		}
		live = append(live, r)
	}
	return live, gone
}

// trusted reports whether root is in s's trust bundle.
func trusted(s *keymgr.State, root *x509.Certificate) bool {
	return slices.ContainsFunc(s.Bundle(), root.Equal)
}

// retiredIssuer refuses a revocation by a retired CA of s: its key is
// destroyed and its CRL dropped, so nothing can list it; what it signed
// is refused only if its own certificate is (--intermediate).
func retiredIssuer(s *keymgr.State, r keymgr.Revocation) error {
	if r.Issuer == "" || liveCAs(s)[r.Issuer] != nil {
		return nil
	}
	for _, a := range s.Authorities {
		if a.Phase == keymgr.PhaseRetired && a.Cert != nil && keymgr.Fingerprint(a.Cert) == r.Issuer {
			return &exitError{code: exitRefused, err: fmt.Errorf("serial %s was issued by authority %.16s, which is retired: its key is destroyed and no CRL of it can list the serial; "+
				"if its leaves may still be valid, revoke its intermediate instead (meshca revoke --intermediate %.16s --reason keyCompromise)", r.Serial.Text(16), r.Issuer, r.Issuer)}
		}
	}
	return nil
}
