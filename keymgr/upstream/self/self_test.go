package self_test

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
	"github.com/meshca/meshca/keymgr/upstream/upstreamtest"
)

func TestContract(t *testing.T) {
	u := self.New()
	upstreamtest.Run(t, upstreamtest.Target{
		Upstream: u,
		Root: func(t testing.TB, kt certs.KeyType) (*x509.Certificate, upstream.Ref, crypto.Signer) {
			t.Helper()
			r, err := u.NewRoot(t.Context(), &upstream.RootRequest{KeyType: kt, Subject: pkix.Name{CommonName: "self test root"}, TTL: 24 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			return r.Cert, r.Ref, r.Key
		},
		Unknown: upstream.Ref{Type: self.Name},
	})
}
