package csr

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Extension OIDs a workload CSR may carry, and basicConstraints, which it
// may not but which gets its own reason.
var (
	oidSAN              = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
)

// GeneralName tags of a uniformResourceIdentifier and a dNSName (RFC
// 5280, 4.2.1.6).
const (
	tagURI = 6
	tagDNS = 2
)

// Policy is the request policy for workload certificates. The zero value is
// not usable; start from DefaultPolicy.
type Policy struct {
	Keys KeyPolicy
}

// DefaultPolicy returns the policy with DefaultKeyPolicy.
func DefaultPolicy() Policy { return Policy{Keys: DefaultKeyPolicy()} }

// WorkloadUsages returns the usages a workload certificate for pub carries:
// digital signature, key encipherment for RSA keys only (RFC 8813 forbids
// it for EC keys), server auth and client auth.
func WorkloadUsages(pub any) Usages {
	u := Usages{
		Key: x509.KeyUsageDigitalSignature,
		Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if _, ok := pub.(*rsa.PublicKey); ok {
		u.Key |= x509.KeyUsageKeyEncipherment
	}
	return u
}

// Check verifies that req asks for exactly the identity id and nothing a
// workload may not have. req must come from Parse (its signature checked).
//
// Rules: the only SAN is one URI equal to id; no DNS, IP, email or other
// names; a subject common name, if any, equals id (other subject attributes
// are never copied into a certificate and are ignored); extensions are only
// subjectAltName, keyUsage and extKeyUsage; requested usages are within
// WorkloadUsages; the key passes the key policy.
func (p Policy) Check(req *x509.CertificateRequest, id spiffeid.ID) error {
	if err := p.Keys.Check(req.PublicKey); err != nil {
		return err
	}
	if cn := req.Subject.CommonName; cn != "" && cn != id.String() {
		return errorf(ReasonExtraName, "subject common name %q is not allowed: leave it empty", cn)
	}
	return p.check(req, id.String(), func(der []byte) error { return checkSAN(der, id) })
}

// CheckDNS is Check for a DNS serving certificate (istiod's): the only
// SANs are exactly names, each a DNS name, and the subject carries no
// common name; the other rules are Check's.
func (p Policy) CheckDNS(req *x509.CertificateRequest, names []string) error {
	want := strings.Join(names, ",")
	if err := p.Keys.Check(req.PublicKey); err != nil {
		return err
	}
	if cn := req.Subject.CommonName; cn != "" {
		return errorf(ReasonExtraName, "subject common name %q is not allowed: leave it empty", cn)
	}
	return p.check(req, want, func(der []byte) error { return checkDNSSAN(der, names) })
}

// check holds req to the rules Check and CheckDNS share after the key
// policy: the extension allow-list with the subjectAltName checked by
// san, and usages within WorkloadUsages. want names the SANs for a
// message.
func (p Policy) check(req *x509.CertificateRequest, want string, san func([]byte) error) error {
	var requested Usages
	var sawSAN bool
	seen := map[string]bool{}
	for _, ext := range req.Extensions {
		key := ext.Id.String()
		if seen[key] {
			return errorf(ReasonMalformed, "extension %s appears twice", key)
		}
		seen[key] = true
		var err error
		switch {
		case ext.Id.Equal(oidSAN):
			sawSAN = true
			err = san(ext.Value)
		case ext.Id.Equal(oidKeyUsage):
			requested.Key, err = parseKeyUsage(ext.Value)
		case ext.Id.Equal(oidExtKeyUsage):
			requested.Ext, err = parseExtKeyUsage(ext.Value)
		case ext.Id.Equal(oidBasicConstraints):
			err = checkBasicConstraints(ext.Value)
		default:
			err = errorf(ReasonExtension, "extension %s is not allowed: only subjectAltName, keyUsage and extKeyUsage", key)
		}
		if err != nil {
			return err
		}
	}
	if !sawSAN {
		return errorf(ReasonIdentity, "CSR has no subjectAltName: it must hold exactly %s", want)
	}
	if extra, ok := requested.Subset(WorkloadUsages(req.PublicKey)); !ok {
		return errorf(ReasonUsage, "usages %q are not allowed for a workload with this key", extra)
	}
	return nil
}

func checkSAN(der []byte, id spiffeid.ID) error {
	var names []asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &names); err != nil || len(rest) != 0 {
		return errorf(ReasonMalformed, "cannot parse subjectAltName")
	}
	want := id.String()
	switch {
	case len(names) == 0:
		return errorf(ReasonIdentity, "subjectAltName is empty: it must hold exactly the URI %s", want)
	case len(names) > 1:
		return errorf(ReasonExtraName, "subjectAltName holds %d names: it must hold exactly the URI %s", len(names), want)
	case names[0].Class != asn1.ClassContextSpecific || names[0].Tag != tagURI || names[0].IsCompound:
		return errorf(ReasonExtraName, "subjectAltName holds a %s: it must hold exactly the URI %s", generalNameKind(names[0]), want)
	case string(names[0].Bytes) != want:
		return errorf(ReasonIdentity, "CSR asks for %q but this caller may only receive %s", string(names[0].Bytes), want)
	}
	return nil
}

// checkDNSSAN checks that der, a subjectAltName, holds exactly names, as
// DNS names, each once.
func checkDNSSAN(der []byte, names []string) error {
	var sans []asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &sans); err != nil || len(rest) != 0 {
		return errorf(ReasonMalformed, "cannot parse subjectAltName")
	}
	want := strings.Join(names, ",")
	seen := map[string]bool{}
	for _, n := range sans {
		if n.Class != asn1.ClassContextSpecific || n.Tag != tagDNS || n.IsCompound {
			return errorf(ReasonExtraName, "subjectAltName holds a %s: it must hold exactly the DNS names %s", generalNameKind(n), want)
		}
		name := string(n.Bytes)
		if seen[name] || !slices.Contains(names, name) {
			return errorf(ReasonIdentity, "subjectAltName names %q, which is not among the DNS names %s, or names it twice", name, want)
		}
		seen[name] = true
	}
	if len(seen) != len(names) {
		return errorf(ReasonIdentity, "subjectAltName holds %d of the DNS names %s: it must hold each", len(seen), want)
	}
	return nil
}

func generalNameKind(n asn1.RawValue) string {
	if n.Class == asn1.ClassContextSpecific {
		switch n.Tag {
		case 0:
			return "otherName"
		case 1:
			return "email address"
		case 2:
			return "DNS name"
		case 4:
			return "directory name"
		case tagURI:
			return "URI"
		case 7:
			return "IP address"
		case 8:
			return "registered ID"
		}
	}
	return "name of an unsupported kind"
}

func parseKeyUsage(der []byte) (x509.KeyUsage, error) {
	var bits asn1.BitString
	if rest, err := asn1.Unmarshal(der, &bits); err != nil || len(rest) != 0 {
		return 0, errorf(ReasonMalformed, "cannot parse keyUsage")
	}
	var ku x509.KeyUsage
	for i := 0; i < bits.BitLength; i++ {
		if bits.At(i) != 0 {
			if i > 8 {
				return 0, errorf(ReasonUsage, "keyUsage bit %d is not defined", i)
			}
			ku |= 1 << uint(i)
		}
	}
	return ku, nil
}

func parseExtKeyUsage(der []byte) ([]x509.ExtKeyUsage, error) {
	var oids []asn1.ObjectIdentifier
	if rest, err := asn1.Unmarshal(der, &oids); err != nil || len(rest) != 0 {
		return nil, errorf(ReasonMalformed, "cannot parse extKeyUsage")
	}
	out := make([]x509.ExtKeyUsage, 0, len(oids))
	for _, oid := range oids {
		eku, ok := extUsageFromOID(oid)
		if !ok {
			return nil, errorf(ReasonUsage, "extended key usage %s is not allowed", oid)
		}
		out = append(out, eku)
	}
	return out, nil
}

func checkBasicConstraints(der []byte) error {
	var bc struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}
	if rest, err := asn1.Unmarshal(der, &bc); err != nil || len(rest) != 0 {
		return errorf(ReasonMalformed, "cannot parse basicConstraints")
	}
	if bc.IsCA {
		return errorf(ReasonCA, "CSR asks for a CA certificate (basicConstraints CA:true); workloads get end-entity certificates")
	}
	return errorf(ReasonExtension, "extension basicConstraints is not allowed: only subjectAltName, keyUsage and extKeyUsage")
}
