package harness_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/zmap/zlint/v3/lint"
)

// TestLintSources: every source the helper names exists in zlint and
// brings lints, so a renamed source cannot silently lint nothing.
func TestLintSources(t *testing.T) {
	reg, err := lint.GlobalRegistry().Filter(lint.FilterOptions{IncludeSources: harness.LintSources})
	if err != nil {
		t.Fatal(err)
	}
	got := map[lint.LintSource]int{}
	for _, s := range harness.LintSources {
		got[s] = len(reg.CertificateLints().BySource(s))
		if got[s] == 0 {
			t.Errorf("source %s brings no lint", s)
		}
	}
	t.Logf("lints per source: %v", got)
}

// ca is a root and its key, for crafting certificates.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCA(t *testing.T) ca {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return ca{create(t, rootTemplate(), nil, key, key), key}
}

func rootTemplate() *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"cluster.local"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
}

// svidTemplate is a leaf as meshca issues it: empty subject, one critical
// URI SAN, digitalSignature, serverAuth and clientAuth, a key identifier.
func svidTemplate(id string) *x509.Certificate {
	u, _ := url.Parse(id)
	return &x509.Certificate{
		SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		SubjectKeyId: []byte{1, 2, 3, 4},
	}
}

func create(t *testing.T, tmpl, parent *x509.Certificate, pub crypto.Signer, signer crypto.Signer) *x509.Certificate {
	t.Helper()
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLint: a certificate shaped as meshca issues it has no finding, and
// each way of breaking the profile is found by the lint that says so.
func TestLint(t *testing.T) {
	root := newCA(t)
	id := "spiffe://cluster.local/ns/a/sa/b"
	sanOID := asn1.ObjectIdentifier{2, 5, 29, 17}
	tests := []struct {
		name   string
		modify func(*x509.Certificate)
		kind   string
		want   []string // lint names
	}{
		{"SVID as meshca issues it", func(*x509.Certificate) {}, harness.KindLeaf, nil},
		{"root as meshca generates it", nil, harness.KindRoot, nil},
		{"SAN not critical under an empty subject", func(c *x509.Certificate) {
			uri := id
			c.URIs = nil
			c.ExtraExtensions = []pkix.Extension{{Id: sanOID, Critical: false, Value: sanValue(t, uri)}}
		}, harness.KindLeaf, []string{"e_ext_san_not_critical_without_subject"}},
		{"keyEncipherment on an EC key", func(c *x509.Certificate) {
			c.KeyUsage |= x509.KeyUsageKeyEncipherment
		}, harness.KindLeaf, []string{"e_ecdsa_allowed_ku"}},
		{"no subject key identifier", func(c *x509.Certificate) {
			c.SubjectKeyId = nil
		}, harness.KindLeaf, []string{"w_ext_subject_key_identifier_missing_sub_cert"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert := root.cert
			if tt.modify != nil {
				tmpl := svidTemplate(id)
				tt.modify(tmpl)
				key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
				cert = create(t, tmpl, root.cert, key, root.key)
			}
			if got := harness.KindOf(cert); got != tt.kind {
				t.Errorf("KindOf = %s, want %s", got, tt.kind)
			}
			var got []string
			for _, f := range harness.Lint(cert) {
				got = append(got, f.Lint)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("findings %v, want %v: %v", got, tt.want, harness.Lint(cert))
			}
			if !harness.WasLinted(cert) {
				t.Error("WasLinted = false after Lint")
			}
		})
	}
}

// sanValue is a subjectAltName extension value holding one URI.
func sanValue(t *testing.T, uri string) []byte {
	v, err := asn1.Marshal([]asn1.RawValue{{Tag: 6, Class: asn1.ClassContextSpecific, Bytes: []byte(uri)}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProblems: go-spiffe's X509-SVID rules, on top of zlint.
func TestProblems(t *testing.T) {
	root, other := newCA(t), newCA(t)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := func(modify func(*x509.Certificate)) *x509.Certificate {
		tmpl := svidTemplate("spiffe://cluster.local/ns/a/sa/b")
		modify(tmpl)
		return create(t, tmpl, root.cert, leafKey, root.key)
	}
	good := leaf(func(*x509.Certificate) {})
	tests := []struct {
		name  string
		chain []*x509.Certificate
		roots []*x509.Certificate
		key   crypto.Signer
		want  string
	}{
		{"valid with the key", []*x509.Certificate{good}, []*x509.Certificate{root.cert}, leafKey, ""},
		{"valid without the key", []*x509.Certificate{good}, []*x509.Certificate{root.cert}, nil, ""},
		{"another bundle", []*x509.Certificate{good}, []*x509.Certificate{other.cert}, nil, "could not verify leaf"},
		{"another key", []*x509.Certificate{good}, []*x509.Certificate{root.cert}, otherKey, "private key"},
		{"no path", []*x509.Certificate{leaf(func(c *x509.Certificate) { c.URIs[0].Path = "" })}, []*x509.Certificate{root.cert}, nil, "no path"},
		{"two URIs", []*x509.Certificate{leaf(func(c *x509.Certificate) { c.URIs = append(c.URIs, c.URIs[0]) })}, []*x509.Certificate{root.cert}, nil, "more than one URI SAN"},
		{"no digitalSignature", []*x509.Certificate{leaf(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyAgreement })}, []*x509.Certificate{root.cert}, nil, "digitalSignature"},
		{"nothing", nil, nil, nil, "no certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Join(harness.Problems(tt.chain, tt.roots, tt.key), "\n")
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("problems %q, want one containing %q", got, tt.want)
			}
		})
	}
}

// clientExceptions are test files that still build caclient clients of
// their own, each with the reason; an entry that no longer applies fails.
var clientExceptions = map[string]string{
	"e2e/fleet_member_test.go": "the fleet's members hold no testing.TB and report through fleet.record: pending harness.Problems in member.store",
}

// TestEveryClientIsLinted: no test outside the harness gets certificates
// from a client the harness does not check: caclient.New and
// caclient.Check are for package checked to call (checked.NewClient and
// checked.Check).
func TestEveryClientIsLinted(t *testing.T) {
	bypass := regexp.MustCompile(`caclient\.(New|Check)\(`)
	seen := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "harness/") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if loc := bypass.FindIndex(src); loc != nil {
			seen[rel] = true
			if clientExceptions[rel] == "" {
				line := 1 + strings.Count(string(src[:loc[0]]), "\n")
				t.Errorf("%s:%d: %s: use checked.NewClient or checked.Check, which lint and verify what is issued", rel, line, src[loc[0]:loc[1]])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for f := range clientExceptions {
		if !seen[f] {
			t.Errorf("%s no longer calls caclient.New or caclient.Check: remove its exception", f)
		}
	}
}

// BenchmarkCheckChain: what the check adds to one reply (a fresh leaf; the
// root is linted once per process).
func BenchmarkCheckChain(b *testing.B) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rootTmpl := rootTemplate()
	rootDER, _ := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, key.Public(), key)
	root, _ := x509.ParseCertificate(rootDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var serial int64 = 10
	for b.Loop() {
		tmpl := svidTemplate("spiffe://cluster.local/ns/a/sa/b")
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		b.StopTimer()
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root, leafKey.Public(), key)
		if err != nil {
			b.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(der)
		b.StartTimer()
		if p := harness.Problems([]*x509.Certificate{leaf}, []*x509.Certificate{root}, leafKey); len(p) != 0 {
			b.Fatal(p)
		}
	}
}
