package keymgr_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// extLeaf is a leaf issued at lcT0 by cert with key, for an hour.
func extLeaf(t *testing.T, cert *x509.Certificate, key crypto.Signer) *x509.Certificate {
	t.Helper()
	return extLeafUntil(t, cert, key, lcT0.Add(time.Hour))
}

// extLeafUntil is a leaf issued at lcT0 by cert with key, until notAfter.
func extLeafUntil(t *testing.T, cert *x509.Certificate, key crypto.Signer, notAfter time.Time) *x509.Certificate {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: lcT0, NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, cert, k.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return leaf
}

// TestExternalTrustJudge: the leaves an external backend returns are
// handed out only under an authority workloads trust by then, the one
// whose key signed them, whichever the backend names.
func TestExternalTrustJudge(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	s, a, b := lcRotating(t) // b prepared at lcT0+1h, safe to activate at lcT0+13h5m
	stranger := lcGenerated(t)
	keyA := a.Key
	retired, _, _ := lcRotated(t)
	old := retired.Authorities[0]
	oldKey := old.Key
	if err := retired.Retire(old.ID(), lcT0.Add(25*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		state  *keymgr.State
		leaf   *x509.Certificate
		named  []*x509.Certificate // the intermediates the backend returned
		now    time.Time
		wantID string
		want   string // error fragment
		guard  bool
	}{
		{name: "active", state: s, leaf: extLeaf(t, a.Cert, keyA), now: lcT0, wantID: a.ID()},
		{name: "prepared before its activation is safe", state: s, leaf: extLeaf(t, b.Cert, b.Key), now: lcT0.Add(2 * time.Hour),
			want: "the backend already signs under this prepared authority", guard: true},
		{name: "prepared once activation is safe", state: s, leaf: extLeaf(t, b.Cert, b.Key), now: lcT0.Add(14 * time.Hour), wantID: b.ID()},
		{name: "no authority of the state", state: s, leaf: extLeaf(t, stranger.Cert, stranger.Key), now: lcT0,
			want: "which is no authority of the CA state: prepare and activate its root with `meshca root`"},
		{name: "retired", state: retired, leaf: extLeaf(t, old.Cert, oldKey), now: lcT0.Add(26 * time.Hour),
			want: "signed under retired authority"},
		{name: "active, named", state: s, leaf: extLeaf(t, a.Cert, keyA), named: []*x509.Certificate{a.Cert}, now: lcT0, wantID: a.ID()},
		{name: "prepared before its activation is safe, the active one named", state: s, leaf: extLeaf(t, b.Cert, b.Key),
			named: []*x509.Certificate{a.Cert}, now: lcT0.Add(2 * time.Hour), want: "the backend already signs under this prepared authority", guard: true},
		{name: "retired, the active one named", state: retired, leaf: extLeaf(t, old.Cert, oldKey),
			named: []*x509.Certificate{retired.Active().Cert}, now: lcT0.Add(26 * time.Hour), want: "signed under retired authority"},
		{name: "no authority of the state, the active one named", state: s, leaf: extLeaf(t, stranger.Cert, stranger.Key),
			named: []*x509.Certificate{a.Cert}, now: lcT0, want: "which is no authority of the CA state"},
		{name: "active, the leaf outliving its path", state: s, leaf: extLeafUntil(t, a.Cert, keyA, a.Cert.NotAfter.Add(time.Second)), now: lcT0,
			want: "past the end of authority " + a.ID()[:16] + "'s path to its root"},
		{name: "active, the leaf ending with its path", state: s, leaf: extLeafUntil(t, a.Cert, keyA, a.Cert.NotAfter), now: lcT0, wantID: a.ID()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := keymgr.NewExternalTrust(td, keymgr.DefaultGuards())
			if err := e.Use(tt.state, tt.now); err != nil {
				t.Fatal(err)
			}
			rec, err := e.Judge(tt.leaf, tt.named, tt.now)
			if tt.want == "" {
				if err != nil || rec.ID() != tt.wantID {
					t.Fatalf("Judge = %v, %v; want %.16s", rec, err, tt.wantID)
				}
				if err := tt.leaf.CheckSignatureFrom(rec.Cert); err != nil {
					t.Fatalf("Judge returned an authority whose key did not sign the leaf: %v", err)
				}
				return
			}
			var ge *keymgr.GuardError
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.As(err, &ge) != tt.guard {
				t.Fatalf("Judge error = %v, want %q (guard %v)", err, tt.want, tt.guard)
			}
			if tt.guard && !ge.SafeAt.Equal(lcT0.Add(13*time.Hour+5*time.Minute)) {
				t.Errorf("safe at %v, want lcT0+13h5m", ge.SafeAt)
			}
		})
	}
}

func TestExternalTrustServesTheStateBundle(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	e := keymgr.NewExternalTrust(td, keymgr.DefaultGuards())
	if _, err := e.GetX509BundleForTrustDomain(td); err == nil || !strings.Contains(err.Error(), "no CA state loaded yet") {
		t.Fatalf("bundle before a state: %v", err)
	}
	if err := e.Use(&keymgr.State{}, lcT0); err == nil || !strings.Contains(err.Error(), "no active authority") {
		t.Fatalf("Use of a state without an active authority: %v", err)
	}
	s, a, b := lcRotating(t)
	if err := e.Use(s, lcT0); err != nil {
		t.Fatal(err)
	}
	bundle, err := e.GetX509BundleForTrustDomain(td)
	if err != nil || len(bundle.X509Authorities()) != 2 || !bundle.HasX509Authority(a.Root) || !bundle.HasX509Authority(b.Root) {
		t.Fatalf("bundle = %v, %v; want the active and the prepared root", bundle, err)
	}
	if _, err := e.GetX509BundleForTrustDomain(spiffeid.RequireTrustDomainFromString("other.example")); err == nil {
		t.Error("a bundle for another trust domain")
	}
	if got, want := e.ChainNotAfter(), a.Cert.NotAfter; !got.Equal(want) {
		t.Errorf("ChainNotAfter %v, want the active root's %v", got, want)
	}
}

func TestAuthorityRecordIntermediates(t *testing.T) {
	gen, imp := lcGenerated(t), lcImported(t)
	if got := gen.Intermediates(); len(got) != 0 {
		t.Errorf("a root authority sends %d intermediates, want none", len(got))
	}
	got := imp.Intermediates()
	if len(got) != 2 || !got[0].Equal(imp.Cert) || !got[1].Equal(imp.Chain[0]) {
		t.Errorf("intermediates of an imported authority: %d, want its signing certificate and chain", len(got))
	}
}
