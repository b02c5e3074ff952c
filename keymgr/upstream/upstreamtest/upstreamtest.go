// Package upstreamtest is the contract every upstream passes. An
// upstream's test calls Run with the upstream and a way to get roots it
// holds the keys of; the suite asks it for intermediates and holds every
// answer to upstream.Check, as the renewer does.
package upstreamtest

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Target is an upstream under test and what the suite needs of it.
type Target struct {
	Upstream upstream.Upstream
	// Root returns a root of key type kt whose key the upstream holds, as
	// the CA state records it: the certificate, its Ref, and its key when
	// the state keeps it (self). It fails t when it cannot.
	Root func(t testing.TB, kt certs.KeyType) (*x509.Certificate, upstream.Ref, crypto.Signer)
	// KeyTypes are the root key types to try; DefaultKeyTypes when empty.
	KeyTypes []certs.KeyType
	// Unknown names, in the upstream's terms, a key it does not hold.
	Unknown upstream.Ref
	// TTL is the intermediates' lifetime; an hour when zero.
	TTL time.Duration
}

// DefaultKeyTypes are the root key types the suite tries by default.
var DefaultKeyTypes = []certs.KeyType{certs.KeyECP256, certs.KeyECP384, certs.KeyRSA2048}

// TrustDomain is the suite's.
var TrustDomain = spiffeid.RequireTrustDomainFromString("upstreamtest.example")

// Run runs the contract suite against tg.
func Run(t *testing.T, tg Target) {
	if len(tg.KeyTypes) == 0 {
		tg.KeyTypes = DefaultKeyTypes
	}
	if tg.TTL == 0 {
		tg.TTL = time.Hour
	}
	t.Run("signs intermediates that pass Check", func(t *testing.T) { signs(t, tg) })
	t.Run("signs concurrently", func(t *testing.T) { concurrent(t, tg) })
	t.Run("refuses a key it does not hold", func(t *testing.T) { unknownKey(t, tg) })
	t.Run("refuses a root that is not its key's", func(t *testing.T) { wrongRoot(t, tg) })
	t.Run("never outlives the root", func(t *testing.T) { pastRoot(t, tg) })
	t.Run("honours the deadline", func(t *testing.T) { deadline(t, tg) })
	t.Run("makes roots", func(t *testing.T) { makesRoots(t, tg) })
	t.Run("serves its roots", func(t *testing.T) { servesRoots(t, tg) })
	t.Run("signs CRLs", func(t *testing.T) { signsCRLs(t, tg) })
}

// signsCRLs: an upstream.CRLSigner signs a CRL its root verifies, and
// refuses a key it does not hold and a root that is not its key's. An
// upstream whose keys the CA state keeps (self) is not asked: meshca
// signs with the key it has.
func signsCRLs(t *testing.T, tg Target) {
	cs, ok := tg.Upstream.(upstream.CRLSigner)
	if !ok {
		t.Skip("not a CRL signer")
	}
	root, ref, rootKey := tg.Root(t, tg.KeyTypes[0])
	if rootKey != nil {
		t.Skip("the CA state keeps this upstream's keys")
	}
	now := time.Now()
	tmpl := &x509.RevocationList{Number: big.NewInt(3), ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(time.Hour),
		RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(42), RevocationTime: now, ReasonCode: 1}}}
	der, err := cs.SignCRL(context.Background(), tmpl, root, ref)
	if err != nil {
		t.Fatalf("SignCRL: %v", err)
	}
	l, err := x509.ParseRevocationList(der)
	switch {
	case err != nil:
		t.Fatalf("the CRL does not parse: %v", err)
	case l.CheckSignatureFrom(root) != nil:
		t.Fatalf("the root does not verify the CRL: %v", l.CheckSignatureFrom(root))
	case l.Number.Int64() != 3 || len(l.RevokedCertificateEntries) != 1 || l.RevokedCertificateEntries[0].SerialNumber.Int64() != 42:
		t.Fatalf("the CRL is not the template: number %v, entries %v", l.Number, l.RevokedCertificateEntries)
	}
	stranger := testca.NewRoot(t, "upstreamtest stranger", testca.Options{})
	_, err = cs.SignCRL(context.Background(), tmpl, stranger.Cert, tg.Unknown)
	mustRefuse(t, err, upstream.KindRefused)
	_, err = cs.SignCRL(context.Background(), tmpl, stranger.Cert, ref)
	mustRefuse(t, err, upstream.KindRefused)
}

// Request is a request for an intermediate of a new key of type kt under
// root, and the key.
func Request(t testing.TB, root *x509.Certificate, ref upstream.Ref, rootKey crypto.Signer, kt certs.KeyType, ttl time.Duration) (*upstream.Request, crypto.Signer) {
	t.Helper()
	key, err := certs.GenerateKey(kt)
	if err != nil {
		t.Fatal(err)
	}
	subject := pkix.Name{Organization: []string{TrustDomain.Name()}, CommonName: "upstreamtest intermediate " + string(kt)}
	csr, err := upstream.NewCSR(key, subject, TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	return &upstream.Request{CSR: csr, Subject: subject, TrustDomain: TrustDomain, Root: root, Ref: ref, RootKey: rootKey, TTL: ttl}, key
}

// sign asks for req with a minute's deadline.
func sign(u upstream.Upstream, req *upstream.Request) (*upstream.Response, time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now()
	resp, err := u.SignIntermediate(ctx, req)
	return resp, now, err
}

func signs(t *testing.T, tg Target) {
	for i, kt := range tg.KeyTypes {
		inters := []certs.KeyType{certs.KeyECP256}
		if i == 0 {
			inters = append(inters, certs.KeyECP384, certs.KeyRSA2048)
		}
		for _, it := range inters {
			t.Run(string(kt)+" root, "+string(it)+" intermediate", func(t *testing.T) {
				root, ref, rootKey := tg.Root(t, kt)
				req, key := Request(t, root, ref, rootKey, it, tg.TTL)
				resp, at, err := sign(tg.Upstream, req)
				if err != nil {
					t.Fatalf("SignIntermediate: %v", err)
				}
				mustPass(t, req, resp, at, root)
				leafVerifies(t, resp, key, root)
			})
		}
	}
}

// mustPass fails t unless resp passes Check under root, the bundle.
func mustPass(t testing.TB, req *upstream.Request, resp *upstream.Response, at time.Time, root *x509.Certificate) {
	t.Helper()
	if err := upstream.Check(req, resp, at, []*x509.Certificate{root}); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// leafVerifies signs a workload leaf with the intermediate and checks it
// is an X509-SVID of the trust bundle {root}, as a workload would.
func leafVerifies(t testing.TB, resp *upstream.Response, key crypto.Signer, root *x509.Certificate) {
	t.Helper()
	inter := &testca.CA{Cert: resp.Cert, Key: key}
	leaf := inter.Leaf(t, TrustDomain.IDString()+"/ns/default/sa/web", nil)
	chain := append([]*x509.Certificate{leaf, resp.Cert}, resp.Chain...)
	if _, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(TrustDomain, []*x509.Certificate{root})); err != nil {
		t.Fatalf("a leaf of the intermediate does not verify: %v", err)
	}
}

func concurrent(t *testing.T, tg Target) {
	root, ref, rootKey := tg.Root(t, tg.KeyTypes[0])
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			req, _ := Request(t, root, ref, rootKey, certs.KeyECP256, tg.TTL)
			resp, at, err := sign(tg.Upstream, req)
			if err == nil {
				err = upstream.Check(req, resp, at, []*x509.Certificate{root})
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// mustRefuse fails t unless err is an *upstream.Error of kind.
func mustRefuse(t testing.TB, err error, kind upstream.Kind) {
	t.Helper()
	var ue *upstream.Error
	switch {
	case err == nil:
		t.Fatal("signed, want a refusal")
	case !errors.As(err, &ue):
		t.Fatalf("error %v (%T) is not an *upstream.Error", err, err)
	case ue.Kind != kind:
		t.Fatalf("error %v is of kind %s, want %s", err, ue.Kind, kind)
	case ue.Upstream == "" || ue.Err == nil:
		t.Fatalf("error %#v does not say which upstream, or why", ue)
	}
}

func unknownKey(t *testing.T, tg Target) {
	stranger := testca.NewRoot(t, "upstreamtest stranger", testca.Options{})
	req, _ := Request(t, stranger.Cert, tg.Unknown, nil, certs.KeyECP256, tg.TTL)
	_, _, err := sign(tg.Upstream, req)
	mustRefuse(t, err, upstream.KindRefused)
}

func wrongRoot(t *testing.T, tg Target) {
	_, ref, rootKey := tg.Root(t, tg.KeyTypes[0])
	stranger := testca.NewRoot(t, "upstreamtest stranger", testca.Options{})
	req, _ := Request(t, stranger.Cert, ref, rootKey, certs.KeyECP256, tg.TTL)
	resp, at, err := sign(tg.Upstream, req)
	if err == nil {
		err = upstream.Check(req, resp, at, []*x509.Certificate{stranger.Cert})
	}
	if err == nil {
		t.Fatal("an intermediate under a root that is not the key's passed Check")
	}
}

func pastRoot(t *testing.T, tg Target) {
	root, ref, rootKey := tg.Root(t, tg.KeyTypes[0])
	req, _ := Request(t, root, ref, rootKey, certs.KeyECP256, time.Until(root.NotAfter)+time.Hour)
	resp, at, err := sign(tg.Upstream, req)
	switch {
	case err != nil:
		return
	case resp.Cert.NotAfter.After(root.NotAfter):
		t.Fatalf("the intermediate ends at %s, after its root (%s)", resp.Cert.NotAfter, root.NotAfter)
	}
	if upstream.Check(req, resp, at, []*x509.Certificate{root}) == nil {
		t.Fatal("an intermediate cut short at its root's end passed Check, which holds it to the lifetime asked")
	}
}

func deadline(t *testing.T, tg Target) {
	root, ref, rootKey := tg.Root(t, tg.KeyTypes[0])
	req, _ := Request(t, root, ref, rootKey, certs.KeyECP256, tg.TTL)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	start := time.Now()
	_, err := tg.Upstream.SignIntermediate(ctx, req)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("an expired deadline took %v to be noticed", took)
	}
	mustRefuse(t, err, upstream.KindUnavailable)
}

func makesRoots(t *testing.T, tg Target) {
	rm, ok := tg.Upstream.(upstream.RootMaker)
	if !ok {
		t.Skip("the upstream makes no roots")
	}
	for _, kt := range tg.KeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			subject := pkix.Name{Organization: []string{TrustDomain.Name()}, CommonName: "upstreamtest root " + string(kt)}
			r, err := rm.NewRoot(ctx, &upstream.RootRequest{KeyType: kt, Subject: subject, TTL: 24 * time.Hour, Now: time.Now()})
			if err != nil {
				t.Fatalf("NewRoot: %v", err)
			}
			switch {
			case r.Cert == nil || !certs.IsSelfSigned(r.Cert) || !r.Cert.IsCA:
				t.Fatal("the new root is not a self-signed CA")
			case r.Ref.Type == "":
				t.Fatal("the new root's Ref has no type")
			case r.Cert.Subject.CommonName != subject.CommonName:
				t.Fatalf("the new root's subject is %q, want %q", r.Cert.Subject, subject)
			}
			req, key := Request(t, r.Cert, r.Ref, r.Key, certs.KeyECP256, tg.TTL)
			resp, at, err := sign(tg.Upstream, req)
			if err != nil {
				t.Fatalf("SignIntermediate under the new root: %v", err)
			}
			mustPass(t, req, resp, at, r.Cert)
			leafVerifies(t, resp, key, r.Cert)
		})
	}
}

func servesRoots(t *testing.T, tg Target) {
	rs, ok := tg.Upstream.(upstream.Roots)
	if !ok {
		t.Skip("the upstream's roots are the CA state's")
	}
	root, _, _ := tg.Root(t, tg.KeyTypes[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	roots, err := rs.Roots(ctx)
	if err != nil {
		t.Fatalf("Roots: %v", err)
	}
	if !slices.ContainsFunc(roots, root.Equal) {
		t.Fatalf("Roots gives %d roots, without the one it signs under", len(roots))
	}
}
