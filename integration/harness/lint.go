package harness

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	zx509 "github.com/zmap/zcrypto/x509"
	"github.com/zmap/zlint/v3"
	"github.com/zmap/zlint/v3/lint"
)

// Kinds of certificate, as findings name them (see KindOf).
const (
	KindLeaf         = "leaf"
	KindIntermediate = "intermediate"
	KindRoot         = "root"
	KindServing      = "serving"
)

// LintSources are the zlint sources every certificate is linted with:
// the RFC 5280 profile, the algorithm RFCs (3279 for RSA and DSA, 5480 for
// ECDSA, 8813 for ECDSA key usages), IDNs in DNS names (5891), and
// zlint's community lints. The Web PKI sources (CA/B Forum, browser root
// programs, ETSI) govern publicly trusted TLS, not a mesh's private CA.
var LintSources = lint.SourceList{lint.RFC5280, lint.RFC3279, lint.RFC5480, lint.RFC8813, lint.RFC5891, lint.Community}

// lintExemptions holds the lints that cannot apply to the certificates
// of a SPIFFE mesh, with the reason. It is empty: every lint of
// LintSources applies, and meshca's certificates pass them all.
var lintExemptions = map[string]string{}

// A Finding is one lint that a certificate failed at Warn level or above.
type Finding struct {
	Kind    string // KindLeaf, ...
	Subject string // the certificate's subject, or its first SAN
	Lint    string // zlint's name, e.g. e_ext_san_not_critical_without_subject
	Status  string // warn, error or fatal
	Details string
}

func (f Finding) String() string {
	s := fmt.Sprintf("zlint: %s certificate %q: %s (%s)", f.Kind, f.Subject, f.Lint, f.Status)
	if f.Details != "" {
		s += ": " + f.Details
	}
	return s
}

var (
	registry = sync.OnceValues(func() (lint.Registry, error) {
		return lint.GlobalRegistry().Filter(lint.FilterOptions{IncludeSources: LintSources})
	})
	// linted remembers every certificate linted in this process, by the
	// SHA-256 of its DER, with its findings: a root in a thousand replies
	// is linted once.
	linted sync.Map // [sha256.Size]byte → []Finding
)

// KindOf names what cert is: a self-signed CA is a root, another CA an
// intermediate, a certificate with a URI SAN and no DNS or IP SAN a leaf
// (an X509-SVID), anything else a serving certificate.
func KindOf(cert *x509.Certificate) string {
	switch {
	case cert.IsCA && cert.CheckSignatureFrom(cert) == nil:
		return KindRoot
	case cert.IsCA:
		return KindIntermediate
	case len(cert.URIs) > 0 && len(cert.DNSNames)+len(cert.IPAddresses) == 0:
		return KindLeaf
	}
	return KindServing
}

// Lint runs zlint with LintSources on cert and returns every warning,
// error and fatal finding not in the documented exemptions (none today).
// A certificate zcrypto cannot parse is a fatal finding.
func Lint(cert *x509.Certificate) []Finding {
	sum := sha256.Sum256(cert.Raw)
	if f, ok := linted.Load(sum); ok {
		return f.([]Finding)
	}
	findings := lintOnce(cert)
	linted.Store(sum, findings)
	return findings
}

func lintOnce(cert *x509.Certificate) []Finding {
	kind, subject := KindOf(cert), describe(cert)
	reg, err := registry()
	if err != nil {
		return []Finding{{Kind: kind, Subject: subject, Lint: "registry", Status: "fatal", Details: err.Error()}}
	}
	zc, err := zx509.ParseCertificate(cert.Raw)
	if err != nil {
		return []Finding{{Kind: kind, Subject: subject, Lint: "zcrypto_parse", Status: "fatal", Details: err.Error()}}
	}
	var out []Finding
	for name, r := range zlint.LintCertificateEx(zc, reg).Results {
		if r.Status < lint.Warn || lintExemptions[name] != "" {
			continue
		}
		out = append(out, Finding{Kind: kind, Subject: subject, Lint: name, Status: r.Status.String(), Details: r.Details})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lint < out[j].Lint })
	return out
}

// WasLinted reports whether cert went through Lint in this process.
func WasLinted(cert *x509.Certificate) bool {
	_, ok := linted.Load(sha256.Sum256(cert.Raw))
	return ok
}

func describe(c *x509.Certificate) string {
	switch {
	case c.Subject.String() != "":
		return c.Subject.String()
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	}
	return fmt.Sprintf("serial %x", c.SerialNumber)
}

// CheckCertificates lints every certificate and fails tb (Errorf: safe
// from any goroutine) for each finding.
func CheckCertificates(tb testing.TB, certs ...*x509.Certificate) {
	tb.Helper()
	for _, c := range certs {
		for _, f := range Lint(c) {
			tb.Errorf("%v", f)
		}
	}
}

// CheckChain is the check every issued certificate goes through: chain
// (the leaf, then its intermediates) and roots (the trust bundle of the
// same reply) pass zlint with no warning or error, and go-spiffe accepts
// the leaf as an X509-SVID of that bundle: x509svid.ParseAndVerify, and
// the SVID rules of x509svid.ParseRaw (with key when the caller has it,
// spelled out when it does not). Each problem fails tb.
func CheckChain(tb testing.TB, chain, roots []*x509.Certificate, key crypto.Signer) {
	tb.Helper()
	for _, p := range Problems(chain, roots, key) {
		tb.Errorf("%s", p)
	}
}

// Problems is CheckChain for callers without a testing.TB: every
// problem, one line each; none when the chain passes.
func Problems(chain, roots []*x509.Certificate, key crypto.Signer) []string {
	if len(chain) == 0 {
		return []string{"harness: no certificate to check"}
	}
	var out []string
	for _, c := range slices.Concat(chain, roots) {
		for _, f := range Lint(c) {
			out = append(out, f.String())
		}
	}
	if len(chain[0].URIs) == 0 && len(chain[0].DNSNames) > 0 {
		if err := checkDNS(chain, roots); err != nil {
			out = append(out, fmt.Sprintf("harness: DNS leaf %q does not verify to the bundle: %v", describe(chain[0]), err))
		}
		return out
	}
	if err := checkSVID(chain, roots, key); err != nil {
		out = append(out, fmt.Sprintf("harness: leaf %q is not an X509-SVID of the reply's bundle: %v", describe(chain[0]), err))
	}
	return out
}

// checkDNS verifies a DNS leaf (istiod's) to roots for each of its names,
// as a server and as a client.
func checkDNS(chain, roots []*x509.Certificate) error {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, name := range chain[0].DNSNames {
		// One usage at a time: Verify accepts a chain that allows any of
		// the usages it is given.
		for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			_, err := chain[0].Verify(x509.VerifyOptions{DNSName: name, Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use}})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func checkSVID(chain, roots []*x509.Certificate, key crypto.Signer) error {
	leaf := chain[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return err
	}
	raw := make([][]byte, len(chain))
	for i, c := range chain {
		raw[i] = c.Raw
	}
	if _, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(id.TrustDomain(), roots)); err != nil {
		return err
	}
	if key != nil {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		_, err = x509svid.ParseRaw(bytes.Join(raw, nil), der)
		return err
	}
	// ParseRaw's rules, for callers without the key.
	switch {
	case id.Path() == "":
		return errors.New("leaf SPIFFE ID has no path")
	case leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0:
		return errors.New("leaf lacks the digitalSignature key usage")
	}
	for _, c := range chain[1:] {
		if !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
			return fmt.Errorf("intermediate %q is not a CA with keyCertSign", describe(c))
		}
	}
	return nil
}
