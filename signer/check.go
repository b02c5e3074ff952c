package signer

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshca/meshca/csr"
)

// emptySubject is the DER of an empty distinguished name, the only subject
// meshca asks for.
var emptySubject = []byte{0x30, 0x00}

var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// GeneralName tags of a uniformResourceIdentifier and a dNSName.
const (
	tagURI = 6
	tagDNS = 2
)

// LifetimeSlack is how far past the requested lifetime an issued
// certificate may end: a backend counts from its own clock, which may run
// a few minutes ahead of meshca's, and cfssl rounds its start to the
// minute. What the check is for, a leaf living to its issuer's expiry or
// days past what was asked, is far beyond it.
const LifetimeSlack = 5 * time.Minute

// Lifetime bounds the NotAfter of an issued certificate (CheckIssued).
type Lifetime struct {
	// Start is when the backend was asked, on meshca's clock, read before
	// the call: the certificate may end at most the request's TTL (and
	// LifetimeSlack, for the backend's clock) after it.
	Start time.Time
	// IssuerNotAfter is when the issuing path expires: the certificate
	// may not end after it. Zero sets no such limit.
	IssuerNotAfter time.Time
}

// LifetimeError is CheckIssued's refusal of a certificate that ends later
// than the requested lifetime allows; a backend adds which setting of its
// own issues for longer than asked.
type LifetimeError struct {
	// NotAfter is the certificate's; Want is the requested end, the
	// request's TTL after Lifetime.Start.
	NotAfter, Want time.Time
}

func (e *LifetimeError) Error() string {
	return fmt.Sprintf("issued certificate expires at %s, past the requested lifetime (until %s)",
		e.NotAfter.UTC().Format(time.RFC3339), e.Want.UTC().Format(time.RFC3339))
}

// HintLifetime adds hint, what the backend's operator must change, to err
// when it is CheckIssued's refusal of a certificate that lives longer than
// requested (a *LifetimeError), and returns err.
func HintLifetime(err error, hint string) error {
	var (
		se *Error
		le *LifetimeError
	)
	if errors.As(err, &le) && errors.As(err, &se) {
		se.Err = fmt.Errorf("%w; %s", se.Err, hint)
	}
	return err
}

// Extensions a workload certificate must not carry: RFC 5280 lets only CA
// certificates carry name constraints, policy mappings and policy
// constraints (4.2.1.5, 4.2.1.10, 4.2.1.11) and inhibitAnyPolicy
// (4.2.1.14); and Microsoft's application policies are extended key
// usages under another name, which Windows honours: refused unless they
// repeat the ones requested.
var forbiddenExtensions = []struct {
	id   asn1.ObjectIdentifier
	name string
}{
	{asn1.ObjectIdentifier{2, 5, 29, 30}, "nameConstraints"},
	{asn1.ObjectIdentifier{2, 5, 29, 33}, "policyMappings"},
	{asn1.ObjectIdentifier{2, 5, 29, 36}, "policyConstraints"},
	{asn1.ObjectIdentifier{2, 5, 29, 54}, "inhibitAnyPolicy"},
	{oidMSApplicationPolicies, "Microsoft application policies"},
}

// CheckIssued holds a certificate a backend issued to meshca's rules, so
// that a permissive profile or role, or a backend that copies from the
// CSR, cannot widen what workloads get. The leaf must certify the CSR's
// key; have an empty subject (meshca never asks for one: see Request);
// carry exactly one SAN, the URI of req.ID (for a DNS request, exactly
// req.DNSNames, each once), in a critical extension; not be
// a CA; carry exactly the key usages and extended key usages of
// req.Usages, and no extension a workload certificate must not carry
// (name constraints, policy mappings, policy constraints,
// inhibitAnyPolicy, Microsoft application policies); and end neither after
// the issuing path (lt.IssuerNotAfter, unless it is zero) nor more than
// LifetimeSlack past req.TTL from lt.Start (a *LifetimeError). A violation
// is KindRefused: the backend's configuration must change.
func CheckIssued(backend string, req *Request, leaf *x509.Certificate, lt Lifetime) error {
	refused := func(format string, args ...any) error { return Errorf(backend, KindRefused, format, args...) }
	extraKU, missingKU := leaf.KeyUsage&^req.Usages.Key, req.Usages.Key&^leaf.KeyUsage
	want := lt.Start.Add(req.TTL)
	switch {
	case !csr.SamePublicKey(leaf.PublicKey, req.CSR.PublicKey):
		return refused("issued certificate does not certify the CSR's key")
	case !bytes.Equal(leaf.RawSubject, emptySubject):
		return refused("issued certificate has the subject %q, want an empty subject: the backend must not copy the CSR's subject or add its own", leaf.Subject.String())
	case leaf.IsCA:
		return refused("issued certificate is a CA")
	case extraKU != 0:
		return refused("issued key usage %q goes beyond the allowed %q: remove the extra usages from the profile or role", keyUsageNames(leaf.KeyUsage), keyUsageNames(req.Usages.Key))
	case missingKU != 0:
		return refused("issued certificate lacks key usage %q (want exactly %q)", keyUsageNames(missingKU), keyUsageNames(req.Usages.Key))
	case len(leaf.UnknownExtKeyUsage) != 0:
		return refused("issued certificate carries extended key usages %v that workloads may not have", leaf.UnknownExtKeyUsage)
	case !lt.IssuerNotAfter.IsZero() && leaf.NotAfter.After(lt.IssuerNotAfter):
		return refused("issued certificate expires at %s, after its issuer (%s)", leaf.NotAfter.UTC().Format(time.RFC3339), lt.IssuerNotAfter.UTC().Format(time.RFC3339))
	case leaf.NotAfter.After(want.Add(LifetimeSlack)):
		return &Error{Backend: backend, Kind: KindRefused, Err: &LifetimeError{NotAfter: leaf.NotAfter, Want: want}}
	}
	if name := forbiddenExtension(leaf, req); name != "" {
		return refused("issued certificate carries the %s extension, which a workload certificate must not carry: remove it from what issues it (the cfssl profile, the Vault role, the external signer's template)", name)
	}
	if err := checkSAN(leaf, req); err != nil {
		return refused("%w", err)
	}
	for _, e := range leaf.ExtKeyUsage {
		if !slices.Contains(req.Usages.Ext, e) {
			return refused("issued extended key usage %v is not allowed for workloads", e)
		}
	}
	for _, e := range req.Usages.Ext {
		if !slices.Contains(leaf.ExtKeyUsage, e) {
			return refused("issued certificate lacks extended key usage %v", e)
		}
	}
	return nil
}

// checkSAN reads the subjectAltName extension itself, so that names
// crypto/x509 does not surface (otherName, directoryName, registeredID)
// are seen too. With an empty subject the extension must be critical
// (RFC 5280, 4.2.1.6).
func checkSAN(leaf *x509.Certificate, req *Request) error {
	want := req.Names()
	var (
		sans  []asn1.RawValue
		found int
	)
	for _, ext := range leaf.Extensions {
		if !ext.Id.Equal(oidSAN) {
			continue
		}
		found++
		if rest, err := asn1.Unmarshal(ext.Value, &sans); err != nil || len(rest) != 0 {
			return fmt.Errorf("issued certificate's subjectAltName cannot be parsed")
		}
		if !ext.Critical {
			return fmt.Errorf("issued certificate's subjectAltName is not critical, though its subject is empty")
		}
	}
	if found != 1 {
		return fmt.Errorf("issued certificate has %d subjectAltName extensions, want one holding exactly %s", found, wantNames(req))
	}
	if req.DNS() {
		if !sameDNSNames(sans, req.DNSNames) {
			return fmt.Errorf("issued certificate names %s, want exactly the DNS names %s", describeNames(sans), want)
		}
		return nil
	}
	switch {
	case len(sans) != 1:
		return fmt.Errorf("issued certificate names %d subject alternative names (%s), want exactly the URI %s", len(sans), describeNames(sans), want)
	case !isURI(sans[0]) || string(sans[0].Bytes) != want:
		return fmt.Errorf("issued certificate names %s, want exactly the URI %s", describeNames(sans), want)
	}
	return nil
}

// wantNames describes the SANs req asks for.
func wantNames(req *Request) string {
	if req.DNS() {
		return "the DNS names " + req.Names()
	}
	return "the URI " + req.Names()
}

// sameDNSNames reports whether sans are exactly the DNS names want, each
// once, in any order, and no other name.
func sameDNSNames(sans []asn1.RawValue, want []string) bool {
	if len(sans) != len(want) {
		return false
	}
	seen := make(map[string]bool, len(sans))
	for _, n := range sans {
		name := string(n.Bytes)
		if n.Class != asn1.ClassContextSpecific || n.Tag != tagDNS || n.IsCompound || seen[name] || !slices.Contains(want, name) {
			return false
		}
		seen[name] = true
	}
	return true
}

// forbiddenExtension names the first extension of leaf that
// forbiddenExtensions lists; "" when there is none. Microsoft's
// application policies pass when they only repeat the extended key usages
// req asks for, as AD CS templates make them.
func forbiddenExtension(leaf *x509.Certificate, req *Request) string {
	for _, ext := range leaf.Extensions {
		for _, f := range forbiddenExtensions {
			if ext.Id.Equal(f.id) && !(ext.Id.Equal(oidMSApplicationPolicies) && mirrorsUsages(ext.Value, req.Usages.Ext)) {
				return f.name
			}
		}
	}
	return ""
}

var oidMSApplicationPolicies = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 21, 10}

// mirrorsUsages reports whether der, an application policies extension
// (a certificatePolicies-shaped SEQUENCE OF PolicyInformation), names
// only policies that are extended key usages of want.
func mirrorsUsages(der []byte, want []x509.ExtKeyUsage) bool {
	var policies []struct {
		ID         asn1.ObjectIdentifier
		Qualifiers asn1.RawValue `asn1:"optional"`
	}
	if rest, err := asn1.Unmarshal(der, &policies); err != nil || len(rest) != 0 {
		return false
	}
	for _, p := range policies {
		if !slices.ContainsFunc(want, func(u x509.ExtKeyUsage) bool {
			oid, ok := csr.ExtKeyUsageOID(u)
			return ok && oid.Equal(p.ID)
		}) {
			return false
		}
	}
	return true
}

func isURI(n asn1.RawValue) bool {
	return n.Class == asn1.ClassContextSpecific && n.Tag == tagURI && !n.IsCompound
}

// describeNames renders general names for an error: URIs, DNS names and
// email addresses by value, other kinds by tag.
func describeNames(names []asn1.RawValue) string {
	var b bytes.Buffer
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		switch {
		case n.Class != asn1.ClassContextSpecific:
			b.WriteString("a malformed name")
		case n.Tag == tagURI, n.Tag == tagDNS, n.Tag == 1:
			fmt.Fprintf(&b, "%q", n.Bytes)
		default:
			fmt.Fprintf(&b, "a general name with tag %d", n.Tag)
		}
	}
	return b.String()
}

func keyUsageNames(ku x509.KeyUsage) []csr.Usage {
	return csr.Usages{Key: ku}.Names()
}
