package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// KeyAndCSR returns a fresh P-256 key and ztunnel's CSR for id.
func KeyAndCSR(tb testing.TB, id spiffeid.ID) (crypto.Signer, string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := csr.Build(key, id)
	if err != nil {
		tb.Fatal(err)
	}
	return key, string(p)
}
