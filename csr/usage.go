package csr

import (
	"crypto/x509"
	"encoding/asn1"
	"slices"
	"strings"
)

// Usage is a key usage in the vocabulary cert-manager and cfssl share:
// either a keyUsage bit ("digital signature") or an extended key usage
// ("server auth").
type Usage string

// The vocabulary. Several names may map to one bit ("signing" and "digital
// signature"); the first name listed for a bit is its canonical name.
const (
	UsageSigning           Usage = "signing"
	UsageDigitalSignature  Usage = "digital signature"
	UsageContentCommitment Usage = "content commitment"
	UsageKeyEncipherment   Usage = "key encipherment"
	UsageKeyAgreement      Usage = "key agreement"
	UsageDataEncipherment  Usage = "data encipherment"
	UsageCertSign          Usage = "cert sign"
	UsageCRLSign           Usage = "crl sign"
	UsageEncipherOnly      Usage = "encipher only"
	UsageDecipherOnly      Usage = "decipher only"
	UsageAny               Usage = "any"
	UsageServerAuth        Usage = "server auth"
	UsageClientAuth        Usage = "client auth"
	UsageCodeSigning       Usage = "code signing"
	UsageEmailProtection   Usage = "email protection"
	UsageSMIME             Usage = "s/mime"
	UsageIPsecEndSystem    Usage = "ipsec end system"
	UsageIPsecTunnel       Usage = "ipsec tunnel"
	UsageIPsecUser         Usage = "ipsec user"
	UsageTimestamping      Usage = "timestamping"
	UsageOCSPSigning       Usage = "ocsp signing"
	UsageMicrosoftSGC      Usage = "microsoft sgc"
	UsageNetscapeSGC       Usage = "netscape sgc"
)

type keyUsageName struct {
	name Usage
	bit  x509.KeyUsage
}

// keyUsageNames lists canonical names first, in bit order (Names relies
// on it).
var keyUsageNames = []keyUsageName{
	{UsageDigitalSignature, x509.KeyUsageDigitalSignature},
	{UsageSigning, x509.KeyUsageDigitalSignature},
	{UsageContentCommitment, x509.KeyUsageContentCommitment},
	{UsageKeyEncipherment, x509.KeyUsageKeyEncipherment},
	{UsageDataEncipherment, x509.KeyUsageDataEncipherment},
	{UsageKeyAgreement, x509.KeyUsageKeyAgreement},
	{UsageCertSign, x509.KeyUsageCertSign},
	{UsageCRLSign, x509.KeyUsageCRLSign},
	{UsageEncipherOnly, x509.KeyUsageEncipherOnly},
	{UsageDecipherOnly, x509.KeyUsageDecipherOnly},
}

type extUsageName struct {
	name Usage
	eku  x509.ExtKeyUsage
	oid  asn1.ObjectIdentifier
}

// extUsageNames lists canonical names first.
var extUsageNames = []extUsageName{
	{UsageAny, x509.ExtKeyUsageAny, asn1.ObjectIdentifier{2, 5, 29, 37, 0}},
	{UsageServerAuth, x509.ExtKeyUsageServerAuth, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}},
	{UsageClientAuth, x509.ExtKeyUsageClientAuth, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}},
	{UsageCodeSigning, x509.ExtKeyUsageCodeSigning, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 3}},
	{UsageEmailProtection, x509.ExtKeyUsageEmailProtection, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 4}},
	{UsageSMIME, x509.ExtKeyUsageEmailProtection, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 4}},
	{UsageIPsecEndSystem, x509.ExtKeyUsageIPSECEndSystem, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 5}},
	{UsageIPsecTunnel, x509.ExtKeyUsageIPSECTunnel, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 6}},
	{UsageIPsecUser, x509.ExtKeyUsageIPSECUser, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 7}},
	{UsageTimestamping, x509.ExtKeyUsageTimeStamping, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 8}},
	{UsageOCSPSigning, x509.ExtKeyUsageOCSPSigning, asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 9}},
	{UsageMicrosoftSGC, x509.ExtKeyUsageMicrosoftServerGatedCrypto, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 10, 3, 3}},
	{UsageNetscapeSGC, x509.ExtKeyUsageNetscapeServerGatedCrypto, asn1.ObjectIdentifier{2, 16, 840, 1, 113730, 4, 1}},
}

// Usages is a parsed set of usages: keyUsage bits and extended key usages.
type Usages struct {
	Key x509.KeyUsage
	Ext []x509.ExtKeyUsage // sorted, without duplicates
}

// ParseUsages maps names of the vocabulary to x509 values. Names are
// matched case-insensitively after trimming; an unknown name is an error,
// never ignored.
func ParseUsages(names []string) (Usages, error) {
	var u Usages
	for _, raw := range names {
		n := Usage(strings.ToLower(strings.TrimSpace(raw)))
		if bit, ok := keyUsageBit(n); ok {
			u.Key |= bit
			continue
		}
		if eku, ok := extUsage(n); ok {
			u.Ext = append(u.Ext, eku)
			continue
		}
		return Usages{}, errorf(ReasonUnknownUse, "unknown key usage %q", raw)
	}
	slices.Sort(u.Ext)
	u.Ext = slices.Compact(u.Ext)
	return u, nil
}

// Names returns the canonical names of u: keyUsage bits first, in bit
// order, then extended key usages in the order of the vocabulary. An
// extended key usage outside the vocabulary is left out.
func (u Usages) Names() []Usage {
	var out []Usage
	seen := x509.KeyUsage(0)
	for _, k := range keyUsageNames {
		if u.Key&k.bit != 0 && seen&k.bit == 0 {
			out = append(out, k.name)
			seen |= k.bit
		}
	}
	for _, e := range extUsageNames {
		if slices.Contains(u.Ext, e.eku) && !slices.Contains(out, canonicalExt(e.eku)) {
			out = append(out, e.name)
		}
	}
	return out
}

// Strings is Names as plain strings, the form cfssl's configuration takes.
func (u Usages) Strings() []string {
	names := u.Names()
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = string(n)
	}
	return out
}

// Subset reports whether every usage in u is also in allowed; if not, it
// returns the canonical names of the usages that are not.
func (u Usages) Subset(allowed Usages) (extra []Usage, ok bool) {
	extra = Usages{Key: u.Key &^ allowed.Key}.Names()
	for _, e := range u.Ext {
		if !slices.Contains(allowed.Ext, e) {
			extra = append(extra, canonicalExt(e))
		}
	}
	return extra, len(extra) == 0
}

// ExtKeyUsageOID returns the OID of an extended key usage of the vocabulary.
func ExtKeyUsageOID(eku x509.ExtKeyUsage) (asn1.ObjectIdentifier, bool) {
	for _, e := range extUsageNames {
		if e.eku == eku {
			return e.oid, true
		}
	}
	return nil, false
}

func keyUsageBit(n Usage) (x509.KeyUsage, bool) {
	for _, k := range keyUsageNames {
		if k.name == n {
			return k.bit, true
		}
	}
	return 0, false
}

func extUsage(n Usage) (x509.ExtKeyUsage, bool) {
	for _, e := range extUsageNames {
		if e.name == n {
			return e.eku, true
		}
	}
	return 0, false
}

func extUsageFromOID(oid asn1.ObjectIdentifier) (x509.ExtKeyUsage, bool) {
	for _, e := range extUsageNames {
		if e.oid.Equal(oid) {
			return e.eku, true
		}
	}
	return 0, false
}

func canonicalExt(eku x509.ExtKeyUsage) Usage {
	for _, e := range extUsageNames {
		if e.eku == eku {
			return e.name
		}
	}
	return Usage("unknown")
}
