package upstream_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/upstreamtest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// breaker is a fake upstream that signs the intermediate asked for as a
// correct upstream would, then breaks one rule: mutate changes the
// template, and the other fields what signs it and what it answers.
type breaker struct {
	root *testca.CA
	// signer signs in place of root; selfSigned signs with the CSR's
	// key, csrKey; pub replaces the CSR's key.
	signer     *testca.CA
	selfSigned bool
	csrKey     crypto.Signer
	pub        crypto.PublicKey
	mutate     func(*x509.Certificate)
	answer     func(resp *upstream.Response) *upstream.Response
}

func (b *breaker) SignIntermediate(_ context.Context, req *upstream.Request) (*upstream.Response, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: req.Subject,
		NotBefore: now.Add(-certs.Backdate), NotAfter: now.Add(req.TTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true, MaxPathLen: 0, MaxPathLenZero: true,
		URIs: []*url.URL{req.TrustDomain.ID().URL()},
	}
	if b.mutate != nil {
		b.mutate(tmpl)
	}
	parent, key, pub := b.root.Cert, b.root.Key, req.CSR.PublicKey
	if b.signer != nil {
		parent, key = b.signer.Cert, b.signer.Key
	}
	if b.pub != nil {
		pub = b.pub
	}
	if b.selfSigned {
		parent, key = tmpl, b.csrKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	resp := &upstream.Response{Cert: cert}
	if b.answer != nil {
		resp = b.answer(resp)
	}
	return resp, nil
}

func TestCheckRefusesEachBrokenRule(t *testing.T) {
	root := testca.NewRoot(t, "check root", testca.Options{})
	stranger := testca.NewRoot(t, "check stranger", testca.Options{})
	short := testca.NewRoot(t, "check short root", testca.Options{NotAfter: time.Now().Add(30 * time.Minute)})
	pathZero := testca.NewRoot(t, "check pathlen-0 root", testca.Options{})
	other, _ := certs.GenerateKey(certs.KeyECP256)
	// A root of path length 0 above the intermediate: the intermediate
	// verifies, its leaves do not.
	pz := &testca.CA{Key: pathZero.Key}
	pz.Cert = reissue(t, pathZero, func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 0, true })
	cases := []struct {
		name   string
		b      *breaker
		root   *testca.CA
		bundle []*x509.Certificate
		want   string
	}{
		{"correct", &breaker{}, nil, nil, ""},
		{"not a CA", &breaker{mutate: func(c *x509.Certificate) { c.IsCA, c.MaxPathLen, c.MaxPathLenZero = false, -1, false }}, nil, nil, "not a CA"},
		{"path length 1", &breaker{mutate: func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 1, false }}, nil, nil, "path length is 1"},
		{"path length unlimited", &breaker{mutate: func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false }}, nil, nil, "path length is unlimited"},
		{"no keyCertSign", &breaker{mutate: func(c *x509.Certificate) { c.KeyUsage &^= x509.KeyUsageCertSign }}, nil, nil, "keyCertSign"},
		{"no cRLSign", &breaker{mutate: func(c *x509.Certificate) { c.KeyUsage &^= x509.KeyUsageCRLSign }}, nil, nil, "cRLSign"},
		{"another key", &breaker{pub: other.Public()}, nil, nil, "not for the key of the CSR"},
		{"under another root", &breaker{signer: stranger}, nil, nil, "does not chain to root"},
		{"self-signed", &breaker{selfSigned: true}, nil, nil, "self-signed"},
		{"longer than asked", &breaker{mutate: func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(time.Hour) }}, nil, nil, "later than asked"},
		{"shorter than asked", &breaker{mutate: func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(-time.Hour) }}, nil, nil, "sooner than asked"},
		{"past its root", &breaker{}, short, nil, "after its root"},
		{"not yet valid", &breaker{mutate: func(c *x509.Certificate) { c.NotBefore = time.Now().Add(time.Hour) }}, nil, nil, "not valid before"},
		{"another trust domain", &breaker{mutate: func(c *x509.Certificate) { c.URIs[0], _ = url.Parse("spiffe://other.example") }}, nil, nil, "not the trust domain's ID"},
		{"a workload's ID", &breaker{mutate: func(c *x509.Certificate) {
			c.URIs[0], _ = url.Parse(upstreamtest.TrustDomain.IDString() + "/ns/a/sa/b")
		}}, nil, nil, "not the trust domain's ID"},
		{"a DNS name", &breaker{mutate: func(c *x509.Certificate) { c.DNSNames = []string{"ca.example"} }}, nil, nil, "DNS, IP or email"},
		{"serverAuth only", &breaker{mutate: func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }}, nil, nil, "serverAuth or clientAuth"},
		{"root out of the bundle", &breaker{}, nil, []*x509.Certificate{stranger.Cert}, "not in the trust bundle"},
		{"no certificate", &breaker{answer: func(*upstream.Response) *upstream.Response { return &upstream.Response{} }}, nil, nil, "no certificate"},
		{"the root in the chain", &breaker{answer: func(r *upstream.Response) *upstream.Response {
			r.Chain = []*x509.Certificate{root.Cert}
			return r
		}}, nil, nil, "chain holds the root"},
		{"under a root of path length 0", &breaker{}, pz, nil, "path length constraint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := root
			if c.root != nil {
				r = c.root
			}
			c.b.root = r
			req, key := upstreamtest.Request(t, r.Cert, upstream.Ref{Type: "fake"}, nil, certs.KeyECP256, time.Hour)
			c.b.csrKey = key
			resp, err := c.b.SignIntermediate(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			err = upstream.Check(req, resp, time.Now(), c.bundle)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Check refused a correct intermediate: %v", err)
				}
				return
			}
			var ue *upstream.Error
			var ce *upstream.CheckError
			switch {
			case err == nil:
				t.Fatal("Check passed it")
			case !errors.As(err, &ue) || ue.Kind != upstream.KindInternal || ue.Upstream != "fake":
				t.Fatalf("error %v is not an *upstream.Error of kind internal from the upstream", err)
			case !errors.As(err, &ce) || !strings.Contains(ce.Rule, c.want):
				t.Fatalf("error %v does not say %q", err, c.want)
			}
		})
	}
}

// reissue is ca's root certificate again, self-signed, with mutate
// applied.
func reissue(t *testing.T, ca *testca.CA, mutate func(*x509.Certificate)) *x509.Certificate {
	t.Helper()
	tmpl := *ca.Cert
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	mutate(&tmpl)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, ca.Key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKeySignedRefuses(t *testing.T) {
	root := testca.NewRoot(t, "keysigned root", testca.Options{})
	stranger := testca.NewRoot(t, "keysigned stranger", testca.Options{})
	u := &upstream.KeySigned{Name: "test", Key: func(_ context.Context, req *upstream.Request) (crypto.Signer, error) {
		if req.RootKey == nil {
			return nil, errors.New("no such key")
		}
		return req.RootKey, nil
	}}
	tamper := func(r *upstream.Request) { r.CSR.Signature[len(r.CSR.Signature)-1] ^= 1 }
	cases := []struct {
		name   string
		change func(*upstream.Request)
		kind   upstream.Kind
		want   string
	}{
		{"a CSR whose signature fails", tamper, upstream.KindRefused, "CSR's signature"},
		{"past the root", func(r *upstream.Request) { r.TTL = 2 * 365 * 24 * time.Hour }, upstream.KindRefused, "outlive its root"},
		{"another root's key", func(r *upstream.Request) { r.RootKey = stranger.Key }, upstream.KindRefused, "is not the key of root"},
		{"a key it does not hold", func(r *upstream.Request) { r.RootKey = nil }, upstream.KindRefused, "no such key"},
		{"no trust domain", func(r *upstream.Request) { r.TrustDomain = spiffeid.TrustDomain{} }, upstream.KindInternal, "no trust domain"},
		{"no lifetime", func(r *upstream.Request) { r.TTL = 0 }, upstream.KindInternal, "not positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := upstreamtest.Request(t, root.Cert, upstream.Ref{Type: "test"}, root.Key, certs.KeyECP256, time.Hour)
			c.change(req)
			_, err := u.SignIntermediate(t.Context(), req)
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != c.kind || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a %s *upstream.Error saying %q", err, c.kind, c.want)
			}
		})
	}
}

func TestKeySignedTemplate(t *testing.T) {
	root := testca.NewRoot(t, "template root", testca.Options{})
	u := &upstream.KeySigned{Name: "test", Key: func(_ context.Context, req *upstream.Request) (crypto.Signer, error) { return req.RootKey, nil }}
	req, _ := upstreamtest.Request(t, root.Cert, upstream.Ref{Type: "test"}, root.Key, certs.KeyECP256, time.Hour)
	req.Subject = pkix.Name{Organization: []string{"o"}, CommonName: "meshca intermediate"}
	resp, err := u.SignIntermediate(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Cert
	switch {
	case c.Subject.CommonName != "meshca intermediate":
		t.Errorf("subject %q", c.Subject)
	case string(c.AuthorityKeyId) != string(root.Cert.SubjectKeyId) || len(c.SubjectKeyId) == 0:
		t.Error("key identifiers missing")
	case c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign|x509.KeyUsageDigitalSignature:
		t.Errorf("key usage %v", c.KeyUsage)
	case len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://upstreamtest.example":
		t.Errorf("URIs %v", c.URIs)
	case time.Since(c.NotBefore) < certs.Backdate-time.Second:
		t.Errorf("not backdated: %v", c.NotBefore)
	}
}
