package bundleendpoint_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/federation"
)

// webCert issues a certificate for 127.0.0.1 from the web CA o names, as
// a public CA would for the https_web profile.
func webCert(t *testing.T, issuer *testca.CA, o keymgr.ServingOptions) *tls.Certificate {
	t.Helper()
	o.Names = []string{"127.0.0.1"}
	c, err := keymgr.IssueServing(issuer.Authority(), o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writePair writes cert's chain and key as PEM files in dir.
func writePair(t *testing.T, dir string, certs []*x509.Certificate, key crypto.Signer) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	keyPEM, err := pemutil.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pemutil.EncodeCertificates(certs...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func writeCert(t *testing.T, dir string, c *tls.Certificate) (string, string) {
	t.Helper()
	return writePair(t, dir, []*x509.Certificate{c.Leaf}, c.PrivateKey.(crypto.Signer))
}

// TestWebProfile: under https_web the endpoint presents the operator's
// certificate, which a federation client verifies as any HTTPS server's
// (WithWebPKIRoots); a renewed certificate in the same files is served
// after a reload, without a restart.
func TestWebProfile(t *testing.T) {
	dir := t.TempDir()
	webCA := testca.NewRoot(t, "web CA", testca.Options{})
	certFile, keyFile := writeCert(t, dir, webCert(t, webCA, keymgr.ServingOptions{}))
	keys, err := bundleendpoint.LoadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan *tls.Certificate, 1)
	keys.Interval, keys.OnReload = 10*time.Millisecond, func(c *tls.Certificate) { reloaded <- c }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go keys.Run(ctx)

	meshRoot := testca.NewRoot(t, "mesh root", testca.Options{})
	src := bundleendpoint.NewSource(td, keymgr.NewManager(td, meshRoot.Authority()), 0)
	url := serve(t, bundleendpoint.Config{Source: src, GetCertificate: keys.GetCertificate})
	fetch := func(ca *testca.CA) error {
		b, err := federation.FetchBundle(context.Background(), td, url, federation.WithWebPKIRoots(certs.Pool(ca.Cert)))
		if err == nil && (len(b.X509Authorities()) != 1 || !b.X509Authorities()[0].Equal(meshRoot.Cert)) {
			t.Fatalf("fetched %d roots, want the mesh root", len(b.X509Authorities()))
		}
		return err
	}
	if err := fetch(webCA); err != nil {
		t.Fatalf("https_web fetch: %v", err)
	}

	renewedCA := testca.NewRoot(t, "renewed web CA", testca.Options{})
	writeCert(t, dir, webCert(t, renewedCA, keymgr.ServingOptions{}))
	select {
	case <-reloaded:
	case <-time.After(5 * time.Second):
		t.Fatal("the renewed certificate was not reloaded within 5s")
	}
	if err := fetch(renewedCA); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	if err := fetch(webCA); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("the replaced certificate is still served: err = %v", err)
	}
}

// TestKeyPairRefusals: files that hold no usable server certificate are
// refused, naming the problem; a bad change keeps the last good one.
func TestKeyPairRefusals(t *testing.T) {
	webCA := testca.NewRoot(t, "web CA", testca.Options{})
	good := webCert(t, webCA, keymgr.ServingOptions{})
	expired := webCert(t, webCA, keymgr.ServingOptions{Now: time.Now().Add(-2 * time.Hour), TTL: time.Hour, Backdate: certs.NoBackdate})
	other := webCert(t, webCA, keymgr.ServingOptions{})
	tests := []struct {
		name  string
		write func(t *testing.T, dir string) (string, string)
		want  string
	}{
		{name: "no files", write: func(_ *testing.T, dir string) (string, string) {
			return filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		}, want: "bundleendpoint: certificate: open"},
		{name: "key of another certificate", write: func(t *testing.T, dir string) (string, string) {
			return writePair(t, dir, []*x509.Certificate{good.Leaf}, other.PrivateKey.(crypto.Signer))
		}, want: "private key does not match public key"},
		{name: "expired", write: func(t *testing.T, dir string) (string, string) { return writeCert(t, dir, expired) }, want: "expired at"},
		{name: "a CA certificate", write: func(t *testing.T, dir string) (string, string) {
			return writePair(t, dir, []*x509.Certificate{webCA.Cert}, webCA.Key)
		}, want: "starts with a CA certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			certFile, keyFile := tt.write(t, t.TempDir())
			if _, err := bundleendpoint.LoadKeyPair(certFile, keyFile); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadKeyPair: err = %v, want %q", err, tt.want)
			}
		})
		t.Run(tt.name+" on reload", func(t *testing.T) {
			dir := t.TempDir()
			certFile, keyFile := writeCert(t, dir, good)
			keys, err := bundleendpoint.LoadKeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(certFile)
			os.Remove(keyFile)
			tt.write(t, dir)
			if _, err := keys.Reload(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Reload: err = %v, want %q", err, tt.want)
			}
			if c, _ := keys.GetCertificate(nil); !c.Leaf.Equal(good.Leaf) {
				t.Fatal("a bad change replaced the certificate served")
			}
		})
	}
}
