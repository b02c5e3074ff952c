package ca

import (
	"crypto/x509"
	"testing"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
)

// TestLeafIssuer: the issuer audited for a leaf is the CA certificate
// that signed it, whichever way the backend answered: its verified
// issuer, its first intermediate, or the one root of the bundle with its
// issuer's name, told apart by signature from a root of the same name;
// none when the answer does not say.
func TestLeafIssuer(t *testing.T) {
	root := testca.NewRoot(t, "meshca root", testca.Options{})
	twin := testca.NewRoot(t, "meshca root", testca.Options{}) // a rotation's next root, same subject
	inter := root.NewIntermediate(t, "inter", testca.Options{})
	const id = "spiffe://cluster.local/ns/a/sa/b"
	byRoot, byTwin, byInter := root.Leaf(t, id, nil), twin.Leaf(t, id, nil), inter.Leaf(t, id, nil)
	other := testca.NewRoot(t, "other", testca.Options{})
	tests := []struct {
		name  string
		res   *signer.Response
		roots []*x509.Certificate
		want  string
	}{
		{"verified issuer", &signer.Response{Leaf: byInter, VerifiedIssuer: inter.Cert}, nil, keymgr.Fingerprint(inter.Cert)},
		{"first intermediate", &signer.Response{Leaf: byInter, Intermediates: []*x509.Certificate{inter.Cert}}, []*x509.Certificate{root.Cert}, keymgr.Fingerprint(inter.Cert)},
		{"intermediate that did not sign it", &signer.Response{Leaf: byRoot, Intermediates: []*x509.Certificate{other.Cert}}, []*x509.Certificate{root.Cert}, ""},
		{"the one root of its name", &signer.Response{Leaf: byRoot}, []*x509.Certificate{other.Cert, root.Cert}, keymgr.Fingerprint(root.Cert)},
		{"two roots of its name: the one that signed", &signer.Response{Leaf: byTwin}, []*x509.Certificate{root.Cert, twin.Cert}, keymgr.Fingerprint(twin.Cert)},
		{"no root of its name", &signer.Response{Leaf: byRoot}, []*x509.Certificate{other.Cert}, ""},
	}
	for _, tt := range tests {
		if got := leafIssuer(tt.res, tt.roots); got != tt.want {
			t.Errorf("%s: %.16s, want %.16s", tt.name, got, tt.want)
		}
	}
}
