package bundleendpoint_test

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

var endpointID = spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/meshca")

// serve runs a Server of c on a kernel-picked loopback port until the test
// ends, when Run must return nil; it returns the endpoint's URL.
func serve(t *testing.T, c bundleendpoint.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Listener, c.TrustDomain = lis, td
	srv, err := bundleendpoint.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	})
	return "https://" + srv.Addr().String() + "/"
}

// ca is meshca's CA as the endpoint sees it: a Manager, and the rotator of
// the endpoint's SVID.
type ca struct {
	mgr *keymgr.Manager
	rot *keymgr.ServingRotator
}

func newCA(t *testing.T, a *keymgr.Authority) *ca {
	t.Helper()
	mgr := keymgr.NewManager(td, a)
	rot, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{ID: endpointID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &ca{mgr: mgr, rot: rot}
}

// set puts a in service, and renews the SVID as meshca does when its CA
// state changes.
func (c *ca) set(t *testing.T, a *keymgr.Authority) {
	t.Helper()
	c.mgr.Set(a)
	if err := c.rot.Renew(); err != nil {
		t.Fatal(err)
	}
}

// TestDocument: the endpoint answers a GET with the SPIFFE bundle of the
// served trust bundle: one x509-svid key per root with the root in x5c,
// spiffe_sequence and spiffe_refresh_hint, as application/json.
func TestDocument(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	c := newCA(t, root.Authority())
	src := bundleendpoint.NewSource(td, c.mgr, 90*time.Second)
	src.Observe(7)
	url := serve(t, bundleendpoint.Config{Source: src, GetCertificate: c.rot.GetCertificate})

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.TLSClientConfig(c.mgr, tlsconfig.AuthorizeID(endpointID))}}
	r, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); r.StatusCode != http.StatusOK || ct != "application/json" {
		t.Fatalf("status %d, Content-Type %q", r.StatusCode, ct)
	}
	var doc struct {
		Keys []struct {
			Kty string   `json:"kty"`
			Use string   `json:"use"`
			X5c []string `json:"x5c"`
		} `json:"keys"`
		Sequence    *uint64 `json:"spiffe_sequence"`
		RefreshHint *int64  `json:"spiffe_refresh_hint"`
	}
	if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Keys) != 1 {
		t.Fatalf("%d keys, want 1", len(doc.Keys))
	}
	k := doc.Keys[0]
	if k.Use != "x509-svid" || k.Kty != "EC" || len(k.X5c) != 1 || k.X5c[0] != base64.StdEncoding.EncodeToString(root.Cert.Raw) {
		t.Errorf("key use %q kty %q x5c %d certificates (the root: %v), want x509-svid, EC, the root alone",
			k.Use, k.Kty, len(k.X5c), len(k.X5c) == 1 && k.X5c[0] == base64.StdEncoding.EncodeToString(root.Cert.Raw))
	}
	if doc.Sequence == nil || *doc.Sequence != 7 {
		t.Errorf("spiffe_sequence %v, want 7", doc.Sequence)
	}
	if doc.RefreshHint == nil || *doc.RefreshHint != 90 {
		t.Errorf("spiffe_refresh_hint %v, want 90 (seconds)", doc.RefreshHint)
	}
}

// TestFederationFollowsRotation: a federation client with https_spiffe
// auth, trusting only the bundle it fetched last (as the Federation
// specification says a client of a self-serving endpoint does), follows a
// whole root rotation: the prepared root arrives with a higher
// spiffe_sequence before it signs, the endpoint's SVID moves to the new
// root on activation, and the old root leaves on retirement.
func TestFederationFollowsRotation(t *testing.T) {
	oldRoot, newRoot := testca.NewRoot(t, "old", testca.Options{}), testca.NewRoot(t, "new", testca.Options{})
	both := []*x509.Certificate{oldRoot.Cert, newRoot.Cert}
	c := newCA(t, oldRoot.Authority())
	src := bundleendpoint.NewSource(td, c.mgr, 0)
	src.Observe(1)
	url := serve(t, bundleendpoint.Config{Source: src, GetCertificate: c.rot.GetCertificate})

	trusted := x509bundle.Source(x509bundle.FromX509Authorities(td, []*x509.Certificate{oldRoot.Cert}))
	fetch := func(step string, wantSeq uint64, want ...*x509.Certificate) {
		t.Helper()
		b, err := federation.FetchBundle(context.Background(), td, url, federation.WithSPIFFEAuth(trusted, endpointID))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if seq, _ := b.SequenceNumber(); seq != wantSeq {
			t.Errorf("%s: spiffe_sequence %d, want %d", step, seq, wantSeq)
		}
		if got := b.X509Authorities(); !certs.SameCerts(got, want) {
			t.Errorf("%s: %d roots, want %d", step, len(got), len(want))
		}
		trusted = b
	}
	fetch("first fetch", 1, oldRoot.Cert)

	c.set(t, oldRoot.Authority(both...))
	src.Observe(2)
	fetch("prepared", 2, both...)

	c.set(t, newRoot.Authority(both...))
	src.Observe(3)
	fetch("activated", 3, both...)
	if _, err := federation.FetchBundle(context.Background(), td, url,
		federation.WithSPIFFEAuth(x509bundle.FromX509Authorities(td, []*x509.Certificate{newRoot.Cert}), endpointID)); err != nil {
		t.Fatalf("after activation the endpoint's SVID does not verify with the new root alone: %v", err)
	}

	c.set(t, newRoot.Authority())
	src.Observe(4)
	fetch("retired", 4, newRoot.Cert)
}

// TestSPIFFEAuthRefusals: a client refuses an endpoint whose SVID is not
// the configured ID, or does not verify against its bundle.
func TestSPIFFEAuthRefusals(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	c := newCA(t, root.Authority())
	url := serve(t, bundleendpoint.Config{Source: bundleendpoint.NewSource(td, c.mgr, 0), GetCertificate: c.rot.GetCertificate})
	other := x509bundle.FromX509Authorities(td, []*x509.Certificate{testca.NewRoot(t, "other", testca.Options{}).Cert})
	tests := []struct {
		name    string
		bundle  x509bundle.Source
		id      spiffeid.ID
		wantErr string
	}{
		{name: "expected ID and bundle", bundle: c.mgr, id: endpointID},
		{name: "another ID", bundle: c.mgr, id: spiffeid.RequireFromString("spiffe://cluster.local/spire/server"), wantErr: "unexpected ID"},
		{name: "another trust bundle", bundle: other, id: endpointID, wantErr: "could not verify leaf certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := federation.FetchBundle(context.Background(), td, url, federation.WithSPIFFEAuth(tt.bundle, tt.id))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// observer records results.
type observer struct {
	mu  sync.Mutex
	got []string
}

func (o *observer) ObserveRequest(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, result)
}

// TestRequestResults: a GET is served, another method refused, and a
// bundle that cannot be had is a 500; each is counted by result.
func TestRequestResults(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	c := newCA(t, root.Authority())
	r := &roots{certs: []*x509.Certificate{root.Cert}}
	o := &observer{}
	url := serve(t, bundleendpoint.Config{Source: bundleendpoint.NewSource(td, r, 0), GetCertificate: c.rot.GetCertificate, Observer: o})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.TLSClientConfig(c.mgr, tlsconfig.AuthorizeID(endpointID))}}
	tests := []struct {
		method string
		fail   error
		status int
		result string
	}{
		{method: http.MethodGet, status: http.StatusOK, result: bundleendpoint.ResultServed},
		{method: http.MethodPost, status: http.StatusMethodNotAllowed, result: bundleendpoint.ResultRefused},
		{method: http.MethodGet, fail: errors.New("no CA state loaded yet"), status: http.StatusInternalServerError, result: bundleendpoint.ResultError},
	}
	for i, tt := range tests {
		r.mu.Lock()
		r.err = tt.fail
		r.mu.Unlock()
		req, _ := http.NewRequest(tt.method, url, http.NoBody)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		o.mu.Lock()
		got := o.got
		o.mu.Unlock()
		if resp.StatusCode != tt.status || len(got) != i+1 || got[i] != tt.result {
			t.Fatalf("%s (source error %v): status %d, results %v; want %d, %q", tt.method, tt.fail, resp.StatusCode, got, tt.status, tt.result)
		}
	}
}

// TestNewRefusals: a Server needs its listener, trust domain, source and
// certificate.
func TestNewRefusals(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	root := testca.NewRoot(t, "root", testca.Options{})
	c := newCA(t, root.Authority())
	good := bundleendpoint.Config{Listener: lis, TrustDomain: td, Source: bundleendpoint.NewSource(td, c.mgr, 0), GetCertificate: c.rot.GetCertificate}
	tests := []struct {
		name   string
		mutate func(*bundleendpoint.Config)
		want   string
	}{
		{name: "no listener", mutate: func(c *bundleendpoint.Config) { c.Listener = nil }, want: "bundleendpoint: no listener"},
		{name: "no trust domain", mutate: func(c *bundleendpoint.Config) { c.TrustDomain = spiffeid.TrustDomain{} }, want: "no trust domain"},
		{name: "no source", mutate: func(c *bundleendpoint.Config) { c.Source = nil }, want: "no bundle source"},
		{name: "no certificate", mutate: func(c *bundleendpoint.Config) { c.GetCertificate = nil }, want: "no certificate to present"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mutate(&c)
			if _, err := bundleendpoint.New(c); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
