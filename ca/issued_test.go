package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

var (
	issuedID = spiffeid.RequireFromString("spiffe://cluster.local/ns/apps/sa/web")
	issuedTD = issuedID.TrustDomain()
)

// leafUnder issues a workload leaf for issuedID signed by ca; mutate
// changes the template first.
func leafUnder(t *testing.T, ca *testca.CA, mutate func(*x509.Certificate)) *x509.Certificate {
	t.Helper()
	return ca.Leaf(t, issuedID.String(), mutate)
}

// constrainedCA is an intermediate under root that may only certify URIs
// in other.example.
func constrainedCA(t *testing.T, root *testca.CA) *testca.CA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "constrained"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, PermittedURIDomains: []string{"other.example"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, key.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testca.CA{Cert: cert, Key: key}
}

// pathLenZeroRoot is a root with pathlen:0: it may sign CAs, but none of
// them may sign leaves.
func pathLenZeroRoot(t *testing.T) *testca.CA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "pathlen 0 root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		MaxPathLen: 0, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testca.CA{Cert: cert, Key: key}
}

// explicitPolicy adds to a leaf policy constraints that require an
// explicit policy at once (requireExplicitPolicy 0), which x509 applies to
// the leaf itself: without certificate policies no chain verifies.
func explicitPolicy(c *x509.Certificate) {
	c.ExtraExtensions = append(c.ExtraExtensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 36}, Value: []byte{0x30, 0x03, 0x80, 0x01, 0x00}})
}

// TestIssuedChains holds the kept paths to what x509svid.Verify decides:
// every answer is the same as a full verification's, and a path is kept
// only when it verified and carries no constraints.
func TestIssuedChains(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	inter := root.NewIntermediate(t, "inter", testca.Options{})
	impostor := testca.NewRoot(t, "inter", testca.Options{}) // inter's name, another key
	other := testca.NewRoot(t, "other root", testca.Options{})
	limited := constrainedCA(t, root)
	plRoot := pathLenZeroRoot(t)
	plInter := plRoot.NewIntermediate(t, "under pathlen 0", testca.Options{})
	bundle := x509bundle.FromX509Authorities(issuedTD, []*x509.Certificate{root.Cert, plRoot.Cert})
	later := root.Cert.NotAfter.Add(time.Hour)
	tests := []struct {
		name string
		res  *signer.Response
		now  time.Time
		ok   bool
		kept bool
	}{
		{"root signs, backend checked the signature", &signer.Response{Leaf: leafUnder(t, root, nil), VerifiedIssuer: root.Cert}, time.Time{}, true, true},
		{"intermediate signs, backend checked", &signer.Response{Leaf: leafUnder(t, inter, nil), Intermediates: []*x509.Certificate{inter.Cert}, VerifiedIssuer: inter.Cert}, time.Time{}, true, true},
		{"intermediate signs, remote answer", &signer.Response{Leaf: leafUnder(t, inter, nil), Intermediates: []*x509.Certificate{inter.Cert}}, time.Time{}, true, true},
		{"forged: the intermediate's name, another key", &signer.Response{Leaf: leafUnder(t, impostor, nil), Intermediates: []*x509.Certificate{inter.Cert}}, time.Time{}, false, true},
		{"root signs, remote answer without intermediates", &signer.Response{Leaf: leafUnder(t, root, nil)}, time.Time{}, true, false},
		{"issuer outside the bundle", &signer.Response{Leaf: leafUnder(t, other, nil), VerifiedIssuer: other.Cert}, time.Time{}, false, false},
		{"everything expired", &signer.Response{Leaf: leafUnder(t, inter, nil), Intermediates: []*x509.Certificate{inter.Cert}}, later, false, false},
		{"leaf is a CA", &signer.Response{Leaf: leafUnder(t, root, func(c *x509.Certificate) { c.IsCA = true }), VerifiedIssuer: root.Cert}, time.Time{}, false, true},
		{"leaf with two URIs", &signer.Response{Leaf: leafUnder(t, root, func(c *x509.Certificate) { c.URIs = append(c.URIs, c.URIs[0]) }), VerifiedIssuer: root.Cert}, time.Time{}, false, true},
		{"root with pathlen 0 over the issuing intermediate", &signer.Response{Leaf: leafUnder(t, plInter, nil), Intermediates: []*x509.Certificate{plInter.Cert}, VerifiedIssuer: plInter.Cert}, time.Time{}, false, false},
		{"name-constrained intermediate", &signer.Response{Leaf: leafUnder(t, limited, nil), Intermediates: []*x509.Certificate{limited.Cert}, VerifiedIssuer: limited.Cert}, time.Time{}, false, false},
		{"leaf requiring an explicit policy at once", &signer.Response{Leaf: leafUnder(t, inter, explicitPolicy), Intermediates: []*x509.Certificate{inter.Cert}}, time.Time{}, false, true},
		{"leaf requiring an explicit policy, backend checked", &signer.Response{Leaf: leafUnder(t, root, explicitPolicy), VerifiedIssuer: root.Cert}, time.Time{}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = time.Now()
			}
			var c issuedChains
			id, out, err := c.verify(c.forBundle(bundle), tt.res, now)
			chain := append([]*x509.Certificate{tt.res.Leaf}, tt.res.Intermediates...)
			wantID, _, wantErr := x509svid.Verify(chain, bundle, x509svid.WithTime(now))
			if (err == nil) != tt.ok || (wantErr == nil) != tt.ok {
				t.Fatalf("err %v, x509svid.Verify says %v, want ok=%v", err, wantErr, tt.ok)
			}
			if kept := len(c.cur.Load().paths) == 1; kept != tt.kept {
				t.Errorf("path kept: %v, want %v", kept, tt.kept)
			}
			if !tt.ok {
				return
			}
			want := []string{}
			for _, cert := range chain {
				want = append(want, string(pemutil.EncodeCertificates(cert)))
			}
			want = append(want, string(pemutil.EncodeCertificates(bundle.X509Authorities()...)))
			if id != wantID || !slices.Equal(out, want) {
				t.Errorf("got %s %q, want %s %q", id, out, wantID, want)
			}
			// A second leaf under the kept path takes the fast checks.
			if _, _, err := c.verify(c.forBundle(bundle), tt.res, now); err != nil {
				t.Errorf("again: %v", err)
			}
		})
	}
}

// TestIssuedChainsRotation: a new bundle starts afresh, and a leaf under
// a root the new bundle lacks is refused although its path was kept.
func TestIssuedChainsRotation(t *testing.T) {
	oldRoot, newRoot := testca.NewRoot(t, "old", testca.Options{}), testca.NewRoot(t, "new", testca.Options{})
	res := &signer.Response{Leaf: leafUnder(t, oldRoot, nil), VerifiedIssuer: oldRoot.Cert}
	var c issuedChains
	both := x509bundle.FromX509Authorities(issuedTD, []*x509.Certificate{oldRoot.Cert, newRoot.Cert})
	if _, out, err := c.verify(c.forBundle(both), res, time.Now()); err != nil || strings.Count(out[len(out)-1], "BEGIN") != 2 {
		t.Fatalf("during the rotation: %v, bundle %q", err, out[len(out)-1])
	}
	only := x509bundle.FromX509Authorities(issuedTD, []*x509.Certificate{newRoot.Cert})
	bc := c.forBundle(only)
	if len(bc.paths) != 0 || strings.Count(bc.pem, "BEGIN") != 1 {
		t.Fatalf("new bundle kept %d paths, PEM %q", len(bc.paths), bc.pem)
	}
	if _, _, err := c.verify(bc, res, time.Now()); err == nil {
		t.Fatal("a leaf of the retired root verified")
	}
}
