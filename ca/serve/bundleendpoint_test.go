package serve_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var endpointID = spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/meshca")

// TestAssembleBundleEndpoint: with BundleEndpoint.Listen, the assembly
// serves the CA state's bundle over https_spiffe with the state's
// Sequence; a root prepared in the state reaches the endpoint with a
// higher sequence, and on activation the endpoint's SVID moves to the new
// root, as the serving certificate does.
func TestAssembleBundleEndpoint(t *testing.T) {
	c := config(t)
	c.BundleEndpoint = serve.BundleEndpoint{Listen: "127.0.0.1:0", ID: endpointID, RefreshHint: time.Minute}
	p := start(t, c)
	url := "https://" + p.Addresses().BundleEndpoint
	store := &dirstore.Store{Dir: c.Backend.StateDir}
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(trusted x509bundle.Source) (*spiffebundle.Bundle, error) {
		return federation.FetchBundle(context.Background(), td, url, federation.WithSPIFFEAuth(trusted, endpointID))
	}
	b, err := fetch(x509bundle.FromX509Authorities(td, st.Bundle()))
	if err != nil {
		t.Fatalf("https_spiffe fetch: %v", err)
	}
	seq, _ := b.SequenceNumber()
	hint, _ := b.RefreshHint()
	if seq != st.Sequence || hint != time.Minute || !b.X509Bundle().Equal(x509bundle.FromX509Authorities(td, st.Bundle())) {
		t.Fatalf("spiffe_sequence %d, refresh hint %v, %d roots; want the state's %d, 1m, %d", seq, hint, len(b.X509Authorities()), st.Sequence, len(st.Bundle()))
	}

	next, err := keymgr.NewRoot(keymgr.RootOptions{Organization: td.Name()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keymgr.Update(context.Background(), store, func(s *keymgr.State) error {
		return s.Prepare(&keymgr.AuthorityRecord{Root: next.Cert, Cert: next.Cert, Key: next.Key, Generated: true}, time.Now(), "test")
	}); err != nil {
		t.Fatal(err)
	}
	prepared := waitFor(t, "the prepared root", func() (*spiffebundle.Bundle, bool) {
		got, err := fetch(b)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := got.SequenceNumber()
		return got, got.HasX509Authority(next.Cert) && n > seq
	})

	if _, err := keymgr.Update(context.Background(), store, func(s *keymgr.State) error {
		return s.Activate(keymgr.Fingerprint(next.Cert), time.Now(), keymgr.DefaultGuards(), true, "test")
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an SVID of the new root", func() (*spiffebundle.Bundle, bool) {
		got, err := fetch(x509bundle.FromX509Authorities(td, []*x509.Certificate{next.Cert}))
		n, _ := prepared.SequenceNumber()
		if err == nil {
			if m, _ := got.SequenceNumber(); m <= n {
				t.Fatalf("activation did not raise spiffe_sequence: %d after %d", m, n)
			}
		}
		return got, err == nil
	})
	if m := metrics(t, p); !strings.Contains(m, `meshca_bundle_endpoint_requests_total{result="served"}`) {
		t.Fatalf("/metrics lacks the bundle endpoint's requests:\n%s", m)
	}
}

// TestAssembleBundleEndpointWeb: an external backend holds no CA key here,
// so its endpoint serves https_web with the operator's certificate; its
// pinned bundle is sequence 1.
func TestAssembleBundleEndpointWeb(t *testing.T) {
	issuer := testca.NewRoot(t, "issuing CA", testca.Options{})
	c := config(t)
	c.Backend = serve.Backend{TrustAnchors: []*x509.Certificate{issuer.Cert},
		External: &external{name: "cfssl", issuer: issuer, holdsKey: true}}
	webCA := testca.NewRoot(t, "web CA", testca.Options{})
	certFile, keyFile := webPair(t, webCA)
	c.BundleEndpoint = serve.BundleEndpoint{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile}
	p := start(t, c)
	b, err := federation.FetchBundle(context.Background(), td, "https://"+p.Addresses().BundleEndpoint+"/",
		federation.WithWebPKIRoots(certs.Pool(webCA.Cert)))
	if err != nil {
		t.Fatalf("https_web fetch: %v", err)
	}
	if seq, _ := b.SequenceNumber(); seq != 1 || len(b.X509Authorities()) != 1 || !b.X509Authorities()[0].Equal(issuer.Cert) {
		t.Fatalf("spiffe_sequence %d, %d roots; want 1 and the pinned anchor", seq, len(b.X509Authorities()))
	}
}

// TestAssembleBundleEndpointRefusals: a bundle endpoint the assembly
// cannot serve names the setting at fault and says why, before any CA is
// built.
func TestAssembleBundleEndpointRefusals(t *testing.T) {
	webCA := testca.NewRoot(t, "web CA", testca.Options{})
	tests := []struct {
		name   string
		mutate func(t *testing.T, c *serve.Config)
		field  string
		want   string
	}{
		{name: "https_spiffe with an external backend", mutate: func(_ *testing.T, c *serve.Config) {
			c.Backend = serve.Backend{External: &external{name: "vault"}}
		}, field: "bundle-endpoint-profile", want: "with the vault backend meshca holds no CA key: serve https_web"},
		{name: "unknown profile", mutate: func(_ *testing.T, c *serve.Config) { c.BundleEndpoint.Profile = "https" },
			field: "bundle-endpoint-profile", want: `"https": want https_spiffe or https_web`},
		{name: "https_web without files", mutate: func(_ *testing.T, c *serve.Config) { c.BundleEndpoint.Profile = "https_web" },
			field: "bundle-endpoint-cert-file", want: "https_web needs the operator's certificate chain and key files"},
		{name: "https_web with a missing file", mutate: func(t *testing.T, c *serve.Config) {
			c.BundleEndpoint.CertFile, c.BundleEndpoint.KeyFile = filepath.Join(t.TempDir(), "tls.crt"), filepath.Join(t.TempDir(), "tls.key")
		}, field: "bundle-endpoint-cert-file", want: "no such file"},
		{name: "https_spiffe with a certificate", mutate: func(t *testing.T, c *serve.Config) {
			c.BundleEndpoint.Profile = "https_spiffe"
			c.BundleEndpoint.CertFile, c.BundleEndpoint.KeyFile = webPair(t, webCA)
		}, field: "bundle-endpoint-cert-file", want: "belongs to https_web"},
		{name: "no SPIFFE ID", mutate: func(_ *testing.T, c *serve.Config) { c.BundleEndpoint.ID = spiffeid.ID{} },
			field: "bundle-endpoint-spiffe-id", want: "https_spiffe needs the endpoint's SPIFFE ID"},
		{name: "SPIFFE ID of another trust domain", mutate: func(_ *testing.T, c *serve.Config) {
			c.BundleEndpoint.ID = spiffeid.RequireFromString("spiffe://example.org/meshca")
		}, field: "bundle-endpoint-spiffe-id", want: "not in trust domain cluster.local"},
		{name: "listen address bad", mutate: func(_ *testing.T, c *serve.Config) { c.BundleEndpoint.Listen = "127.0.0.1:-1" },
			field: "bundle-endpoint-listen", want: "invalid port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t)
			c.BundleEndpoint = serve.BundleEndpoint{Listen: "127.0.0.1:0", ID: endpointID}
			tt.mutate(t, &c)
			_, err := serve.Assemble(context.Background(), c)
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !strings.Contains(fe.Err.Error(), tt.want) {
				t.Fatalf("err = %v, want a FieldError for %q saying %q", err, tt.field, tt.want)
			}
			if tt.field != "bundle-endpoint-listen" {
				if _, err := os.Stat(c.Backend.StateDir); !os.IsNotExist(err) {
					t.Errorf("a refused bundle endpoint left a CA state behind (%v)", err)
				}
			}
		})
	}
}

// waitFor polls check for 5 s, the time a running meshca has to follow a
// change of its CA state.
func waitFor(t *testing.T, what string, check func() (*spiffebundle.Bundle, bool)) *spiffebundle.Bundle {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, ok := check()
		if ok {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bundle endpoint did not serve %s within 5s", what)
		}
	}
}

// webPair writes a certificate for 127.0.0.1 from issuer and its key.
func webPair(t *testing.T, issuer *testca.CA) (certFile, keyFile string) {
	t.Helper()
	c, err := keymgr.IssueServing(issuer.Authority(), keymgr.ServingOptions{Names: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	key, err := pemutil.EncodePrivateKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pemutil.EncodeCertificates(c.Leaf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func metrics(t *testing.T, p *serve.Parts) string {
	t.Helper()
	r, err := http.Get("http://" + p.Addresses().Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return string(body)
}
