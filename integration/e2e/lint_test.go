package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
)

// TestCertificatesLint: for every key type a workload may hold, the
// built-in CA's leaf, its generated root (of each key type) and its
// serving certificate (as the client's connection saw it) pass zlint
// (harness.LintSources) with no warning or error, and the leaf is an
// X509-SVID of the reply's bundle; and the harness's client ran those
// checks on all three by itself.
func TestCertificatesLint(t *testing.T) {
	keys := []struct {
		name string
		new  func() (crypto.Signer, error)
	}{
		{"P-256", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }},
		{"P-384", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P384(), rand.Reader) }},
		{"Ed25519", func() (crypto.Signer, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err }},
		{"RSA-2048", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) }},
	}
	roots := []struct {
		name  string
		flags []string
	}{
		{"ec-p256 root", nil},
		{"ec-p384 root", []string{"--root-key-type", "ec-p384"}},
		{"rsa-2048 root", []string{"--root-key-type", "rsa-2048"}},
	}
	for _, r := range roots {
		t.Run(r.name, func(t *testing.T) {
			s := startServer(t, r.flags...)
			w := cluster.NewWorkload(t, cluster.Namespace(t, "lint"), "frontend", "node-a")
			id := workloadID(w)
			c := s.client(t, w.Token)
			for _, k := range keys {
				t.Run(k.name, func(t *testing.T) {
					key, err := k.new()
					if err != nil {
						t.Fatal(err)
					}
					csrPEM, err := csr.Build(key, id)
					if err != nil {
						t.Fatal(err)
					}
					reply, err := c.Call(context.Background(), string(csrPEM), id, caclient.Options{})
					if err != nil {
						t.Fatal(err)
					}
					// What the client checked by itself, before this test checks anything.
					chain, roots, err := harness.ParseReply(reply)
					if err != nil {
						t.Fatal(err)
					}
					if len(chain) != 1 || len(roots) != 1 {
						t.Fatalf("chain of %d with %d roots, want a leaf under the one generated root", len(chain), len(roots))
					}
					serving := c.Serving()
					if len(serving) == 0 {
						t.Fatal("the client linted no serving certificate")
					}
					for _, cert := range []struct {
						kind string
						c    *x509.Certificate
					}{{harness.KindLeaf, chain[0]}, {harness.KindRoot, roots[0]}, {harness.KindServing, serving[0]}} {
						if got := harness.KindOf(cert.c); got != cert.kind {
							t.Errorf("%s certificate taken for a %s", cert.kind, got)
						}
						if !harness.WasLinted(cert.c) {
							t.Errorf("the client did not lint the %s certificate", cert.kind)
						}
						if f := harness.Lint(cert.c); len(f) != 0 {
							t.Errorf("%s certificate: %d findings: %v", cert.kind, len(f), f)
						}
					}
					// With the key: x509svid.ParseRaw too.
					if _, err := checked.Check(t, reply, id, key); err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
}
