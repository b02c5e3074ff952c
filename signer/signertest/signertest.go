// Package signertest is the contract every signer backend passes. A
// backend's test calls Run with a function that builds the backend over a
// CA the suite provides, so that the suite knows the trust bundle and the
// issuer's expiry.
package signertest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Backend builds the signer under test.
type Backend struct {
	// New returns a signer that signs with ca. ca.Roots is the trust bundle.
	New func(t testing.TB, ca *keymgr.Authority) signer.Signer
	// FixedLifetime is set for a backend whose lifetime is fixed by its own
	// configuration (a remote cfssl profile's expiry): the suite then asks
	// for exactly that TTL, and the backend may refuse, rather than cap, a
	// certificate that would outlive its issuer.
	FixedLifetime time.Duration
	// InexactLifetime is set for a backend whose external signer decides
	// a certificate's validity (k8scsr): the suite does not ask it for an
	// exact signer.Request.Lifetime.
	InexactLifetime bool
	// DNS is set for a backend that issues DNS requests (istiod's
	// serving certificate): New configures its role or profile for them.
	// Without it the suite checks that DNS requests are refused.
	DNS bool
}

// fixedTTL asks every request for one TTL.
type fixedTTL struct {
	signer.Signer
	ttl time.Duration
}

func (f fixedTTL) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	r := *req
	r.TTL = f.ttl
	return f.Signer.Sign(ctx, &r)
}

// Tolerance allowed between the suite's clock and the backend's.
const Tolerance = 30 * time.Second

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// Run runs the contract suite against b.
func Run(t *testing.T, b Backend) {
	root := testca.NewRoot(t, "signertest root", testca.Options{})
	inter := root.NewIntermediate(t, "signertest intermediate", testca.Options{})
	short := root.NewIntermediate(t, "signertest short-lived", testca.Options{NotAfter: time.Now().Add(2 * time.Hour)})
	cases := []struct {
		name string
		ca   *keymgr.Authority
	}{
		{"root signs", root.Authority()},
		{"intermediate signs", inter.Authority()},
	}
	newSigner := func(t testing.TB, a *keymgr.Authority) signer.Signer {
		if b.FixedLifetime > 0 {
			return fixedTTL{b.New(t, a), b.FixedLifetime}
		}
		return b.New(t, a)
	}
	ttls := []time.Duration{time.Hour, 24 * time.Hour}
	if b.FixedLifetime > 0 {
		ttls = []time.Duration{b.FixedLifetime}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSigner(t, c.ca)
			t.Run("ExactSAN", func(t *testing.T) { testExactSAN(t, s, c.ca) })
			t.Run("Usages", func(t *testing.T) { testUsages(t, s, c.ca) })
			t.Run("SubjectFromCSR", func(t *testing.T) { testSubjectFromCSR(t, s) })
			t.Run("TTL", func(t *testing.T) { testTTL(t, s, c.ca, ttls, b.FixedLifetime > 0) })
			if b.FixedLifetime == 0 && !b.InexactLifetime {
				t.Run("Lifetime", func(t *testing.T) { testLifetime(t, s) })
			}
			t.Run("SerialAndKeyID", func(t *testing.T) { testSerialAndKeyID(t, s, c.ca) })
			t.Run("Canceled", func(t *testing.T) { testCanceled(t, s) })
			t.Run("DNS", func(t *testing.T) { testDNS(t, s, c.ca, b.DNS, ttls[0]) })
		})
	}
	t.Run("NotAfterCappedAtIssuer", func(t *testing.T) {
		a := short.Authority()
		s := newSigner(t, a)
		id := workload("default", "capped")
		if b.FixedLifetime > 0 {
			_, err := s.Sign(context.Background(), NewRequest(t, id, newKey(t, "p256"), 24*time.Hour))
			if err == nil || signer.KindOf(err) != signer.KindRefused {
				t.Fatalf("a certificate outliving its issuer: err = %v, want a refusal", err)
			}
			return
		}
		res := sign(t, s, a, id, newKey(t, "p256"), 24*time.Hour)
		if res.Leaf.NotAfter.After(short.Cert.NotAfter) {
			t.Fatalf("NotAfter %v is past the issuer's %v", res.Leaf.NotAfter, short.Cert.NotAfter)
		}
	})
}

// sign issues a certificate for id and checks what every issued chain must
// satisfy: it verifies to the bundle as an SVID for exactly id, and no root
// travels among the intermediates.
func sign(t *testing.T, s signer.Signer, a *keymgr.Authority, id spiffeid.ID, key crypto.Signer, ttl time.Duration) *signer.Response {
	t.Helper()
	res, err := s.Sign(context.Background(), NewRequest(t, id, key, ttl))
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	chain := append([]*x509.Certificate{res.Leaf}, res.Intermediates...)
	got, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, a.Roots))
	if err != nil {
		t.Fatalf("issued chain does not verify against the bundle: %v", err)
	}
	if got != id {
		t.Fatalf("verified ID %s, want %s", got, id)
	}
	for _, c := range res.Intermediates {
		if slices.ContainsFunc(a.Roots, c.Equal) {
			t.Fatalf("root %s sent among the intermediates", c.Subject)
		}
	}
	if !csr.SamePublicKey(res.Leaf.PublicKey, key.Public()) {
		t.Fatal("leaf does not certify the CSR's key")
	}
	return res
}

func testExactSAN(t *testing.T, s signer.Signer, a *keymgr.Authority) {
	id := workload("prod", "frontend")
	leaf := sign(t, s, a, id, newKey(t, "p256"), time.Hour).Leaf
	switch {
	case len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String():
		t.Fatalf("URI SANs %v, want exactly %s", leaf.URIs, id)
	case len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0:
		t.Fatalf("extra SANs: DNS %v IP %v email %v", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	case leaf.BasicConstraintsValid && leaf.IsCA:
		t.Fatal("leaf is a CA")
	}
	if len(leaf.Subject.Names) == 0 {
		for _, e := range leaf.Extensions {
			if e.Id.String() == "2.5.29.17" && !e.Critical {
				t.Fatal("subjectAltName must be critical when the subject is empty")
			}
		}
	}
}

func testUsages(t *testing.T, s signer.Signer, a *keymgr.Authority) {
	// Exactly digital signature, plus key encipherment for RSA keys and
	// never for EC keys (RFC 8813): what csr.WorkloadUsages derives from the
	// key, whatever the backend's own profile or role says.
	tests := []struct {
		key  string
		want x509.KeyUsage
	}{
		{"p256", x509.KeyUsageDigitalSignature},
		{"p384", x509.KeyUsageDigitalSignature},
		{"rsa2048", x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			id := workload("default", tt.key)
			leaf := sign(t, s, a, id, newKey(t, tt.key), time.Hour).Leaf
			if leaf.KeyUsage != tt.want {
				t.Errorf("key usage %q, want exactly %q", csr.Usages{Key: leaf.KeyUsage}.Names(), csr.Usages{Key: tt.want}.Names())
			}
			wantExt := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
			got := slices.Clone(leaf.ExtKeyUsage)
			slices.Sort(got)
			if !slices.Equal(got, wantExt) || len(leaf.UnknownExtKeyUsage) != 0 {
				t.Errorf("ext key usage %v (+%v unknown), want %v", leaf.ExtKeyUsage, leaf.UnknownExtKeyUsage, wantExt)
			}
		})
	}
}

// testSubjectFromCSR: the CSR's subject never reaches the leaf. csr.Check
// lets some subjects through (istio-agent sends an empty organization; a
// common name equal to the identity is allowed; other attributes are
// ignored), and the leaf's subject is empty whatever the CSR says.
func testSubjectFromCSR(t *testing.T, s signer.Signer) {
	id := workload("default", "subject")
	tests := []struct {
		name    string
		subject pkix.Name
	}{
		{"istio-agent empty organization", pkix.Name{Organization: []string{""}}},
		{"organization and unit", pkix.Name{Organization: []string{"system:masters"}, OrganizationalUnit: []string{"cluster-admins"}}},
		{"common name equal to the identity", pkix.Name{CommonName: id.String(), Organization: []string{"system:masters"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := newKey(t, "p256")
			san, err := csr.MarshalURISAN(id.String())
			if err != nil {
				t.Fatal(err)
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: tt.subject, ExtraExtensions: []pkix.Extension{san}}, key)
			if err != nil {
				t.Fatal(err)
			}
			req, err := csr.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
			if err != nil {
				t.Fatal(err)
			}
			if err := csr.DefaultPolicy().Check(req, id); err != nil {
				t.Fatalf("the CSR must pass meshca's policy for this case to matter: %v", err)
			}
			res, err := s.Sign(context.Background(), &signer.Request{CSR: req, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(req.PublicKey)})
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if len(res.Leaf.Subject.Names) != 0 || len(res.Leaf.RawSubject) != 2 {
				t.Fatalf("leaf subject %q, want an empty subject", res.Leaf.Subject)
			}
		})
	}
}

// testTTL: NotAfter is now+TTL. A fixed-lifetime backend counts from its
// own backdated NotBefore, so it may end up to ten minutes early, never late.
func testTTL(t *testing.T, s signer.Signer, a *keymgr.Authority, ttls []time.Duration, fixed bool) {
	early := -Tolerance
	if fixed {
		early = -10 * time.Minute
	}
	for _, ttl := range ttls {
		before := time.Now()
		leaf := sign(t, s, a, workload("default", "ttl"), newKey(t, "p256"), ttl).Leaf
		want := before.Add(ttl)
		if d := leaf.NotAfter.Sub(want); d < early || d > Tolerance {
			t.Errorf("TTL %v: NotAfter %v, want %v ± %v", ttl, leaf.NotAfter, want, Tolerance)
		}
		if !leaf.NotBefore.Before(before.Add(-time.Minute)) && leaf.NotBefore.After(a.Cert.NotBefore) {
			t.Errorf("NotBefore %v is not backdated (request at %v)", leaf.NotBefore, before)
		}
	}
}

// testLifetime: with Lifetime set, NotAfter less NotBefore is exactly
// Lifetime, the API's minimum for a pod certificate (one hour) included,
// and NotAfter is still at most TTL from now.
func testLifetime(t *testing.T, s signer.Signer) {
	for _, life := range []time.Duration{time.Hour, 90*time.Minute + 7*time.Second} {
		req := NewRequest(t, workload("default", "lifetime"), newKey(t, "p256"), life)
		req.Lifetime = life
		before := time.Now()
		res, err := s.Sign(context.Background(), req)
		if err != nil {
			t.Fatalf("Lifetime %v: Sign: %v", life, err)
		}
		leaf := res.Leaf
		if got := leaf.NotAfter.Sub(leaf.NotBefore); got != life {
			t.Errorf("Lifetime %v: issued %v to %v, a lifetime of %v", life, leaf.NotBefore, leaf.NotAfter, got)
		}
		if limit := before.Add(life + Tolerance); leaf.NotAfter.After(limit) {
			t.Errorf("Lifetime %v: NotAfter %v is later than TTL from now (%v)", life, leaf.NotAfter, limit)
		}
		if leaf.NotBefore.After(time.Now()) {
			t.Errorf("Lifetime %v: NotBefore %v is in the future", life, leaf.NotBefore)
		}
	}
}

func testSerialAndKeyID(t *testing.T, s signer.Signer, a *keymgr.Authority) {
	const n = 8
	var (
		mu      sync.Mutex
		serials = map[string]bool{}
		maxBits int
		wg      sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaf := sign(t, s, a, workload("default", "serial"), newKey(t, "p256"), time.Hour).Leaf
			if len(leaf.SubjectKeyId) == 0 {
				t.Errorf("leaf %d has no subject key identifier", i)
			}
			if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.Cmp(new(big.Int).Lsh(big.NewInt(1), 160)) >= 0 {
				t.Errorf("serial %v is not a positive number of at most 20 octets", leaf.SerialNumber)
			}
			mu.Lock()
			defer mu.Unlock()
			serials[leaf.SerialNumber.String()] = true
			maxBits = max(maxBits, leaf.SerialNumber.BitLen())
		}()
	}
	wg.Wait()
	if len(serials) != n {
		t.Errorf("%d distinct serials in %d certificates", len(serials), n)
	}
	// Eight random 128-bit serials all under 2^120 happen with odds of 2^-64.
	if maxBits < 120 {
		t.Errorf("largest serial has %d bits; serials must carry 128 random bits", maxBits)
	}
}

func testCanceled(t *testing.T, s signer.Signer) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := newKey(t, "p256")
	id := workload("default", "canceled")
	pemCSR, _ := csr.Build(key, id)
	req, _ := csr.Parse(pemCSR)
	_, err := s.Sign(ctx, &signer.Request{CSR: req, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(req.PublicKey)})
	if err == nil {
		t.Fatal("Sign with a canceled context succeeded")
	}
	if k := signer.KindOf(err); k != signer.KindUnavailable {
		t.Fatalf("kind %s, want %s (err %v)", k, signer.KindUnavailable, err)
	}
}

var (
	keyMu    sync.Mutex
	rsaCache crypto.Signer
)

func newKey(t *testing.T, kind string) crypto.Signer {
	t.Helper()
	var (
		k   crypto.Signer
		err error
	)
	switch kind {
	case "p256":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "p384":
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "rsa2048":
		keyMu.Lock()
		defer keyMu.Unlock()
		if rsaCache == nil {
			rsaCache, err = rsa.GenerateKey(rand.Reader, 2048)
		}
		k = rsaCache
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func workload(ns, sa string) spiffeid.ID {
	return spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa)
}
