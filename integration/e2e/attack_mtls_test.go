package e2e

import (
	"context"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// mtlsAttacks: renewals by client certificate. A certificate that
// verifies may only renew its own identity, never impersonate (it names
// no Pod), and only while a Pod of its service account lives (README:
// Unauthenticated cert_workload_gone). A certificate that does not verify
// against the current bundle (expired, foreign CA, retired root) is
// refused by the TLS handshake itself: the wire contract has the server
// verify client certificates at the TLS layer when given, as istiod does
// (tls.VerifyClientCertIfGiven), so the client sees the handshake fail,
// which gRPC reports as Unavailable with the TLS alert in the message.
func (a *arena) mtlsAttacks(t *testing.T) []attack {
	ctx := context.Background()
	fetch := func(token string, id spiffeid.ID, o caclient.Options) *caclient.SVID {
		t.Helper()
		svid, err := a.s.client(t, token).Fetch(ctx, id, o)
		if err != nil {
			t.Fatalf("fetch %s: %v", id, err)
		}
		return svid
	}
	cache := cluster.NewWorkload(t, a.apps, "cache", "node-a")
	leaver := cluster.NewWorkload(t, a.apps, "leaver", "node-b")
	a.secret(cache.Token, leaver.Token)
	a.webCert = fetch(a.web.Token, a.webID, caclient.Options{TTL: time.Hour}).TLSCertificate()
	zID := spiffeid.RequireFromString(a.ztunnelID())
	zCert := fetch(a.ztunnelA.Token, zID, caclient.Options{}).TLSCertificate()
	leaverCert := fetch(leaver.Token, a.id("leaver"), caclient.Options{}).TLSCertificate()
	cluster.DeletePod(t, a.apps, leaver.Pod)
	expired := fetch(a.web.Token, a.webID, caclient.Options{TTL: 2 * time.Second}).TLSCertificate()
	waitExpired := func(t *testing.T) { time.Sleep(time.Until(expired.Leaf.NotAfter.Add(time.Second))) }
	forged := a.forgedSVID(t)

	req := func(id spiffeid.ID, impersonate bool) *authpb.IstioCertificateRequest {
		r := &authpb.IstioCertificateRequest{Csr: newCSR(t, id), ValidityDuration: 86400}
		if impersonate {
			r.Metadata = meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(id.String()))
		}
		return r
	}
	own := req(a.webID, false)
	return []attack{
		{name: "mtls/certificate asking for another identity", do: a.do(probe{cert: a.webCert, req: req(a.id("cache"), false)}),
			code: codes.InvalidArgument, msg: "may only receive " + a.webID.String(), reason: "csr_identity_mismatch"},
		{name: "mtls/certificate impersonating a workload on its node", do: a.do(probe{cert: a.webCert, req: req(a.id("cache"), true)}),
			code: codes.PermissionDenied, msg: deniedMsg, reason: "untrusted_caller"},
		// A stolen ztunnel certificate is not a ztunnel: it names no Pod
		// and so no node.
		{name: "mtls/ztunnel's certificate impersonating", do: a.do(probe{cert: zCert, req: req(a.webID, true)}),
			code: codes.PermissionDenied, msg: deniedMsg, reason: "caller_not_pod_bound"},
		// The certificate authenticates first (README, step 2), so a token
		// of another identity next to it changes nothing.
		{name: "mtls/certificate outranks a token of another identity", do: a.do(probe{cert: a.webCert, token: cache.Token, req: req(a.id("cache"), false)}),
			code: codes.InvalidArgument, msg: "may only receive " + a.webID.String(), reason: "csr_identity_mismatch"},
		{name: "mtls/certificate of a workload with no Pod left", do: a.do(probe{cert: leaverCert, req: req(a.id("leaver"), false)}),
			code: codes.Unauthenticated, msg: "no running Pod has this certificate's service account", reason: "cert_workload_gone"},
		{name: "mtls/certificate from a foreign CA", do: a.do(probe{cert: forged, tls12: true, req: own}), transport: true,
			code: codes.Unavailable, msg: "tls: unknown certificate authority"},
		{name: "mtls/expired certificate", before: waitExpired, do: a.do(probe{cert: expired, tls12: true, req: own}), transport: true,
			code: codes.Unavailable, msg: "tls: expired certificate"},
		// The handshake fails before the token is read: a client holding
		// an expired certificate must drop it to fall back to its token.
		// Over TLS 1.3, as ztunnel and istio-agent speak it, the server's
		// alert races the client's first write, so the message may only
		// say the connection broke: the code is the contract.
		{name: "mtls/expired certificate with a valid token, TLS 1.3", before: waitExpired, do: a.do(probe{cert: expired, token: a.web.Token, req: own}),
			transport: true, code: codes.Unavailable},
	}
}

// forgedSVID is an SVID of the web workload from a CA of its own making.
func (a *arena) forgedSVID(t *testing.T) *tls.Certificate {
	t.Helper()
	evil := testca.NewRoot(t, "cluster.local", testca.Options{})
	key := ecKey(t, elliptic.P256())
	u, _ := url.Parse(a.webID.String())
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(4242), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, evil.Cert, key.Public(), evil.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der, evil.Cert.Raw}, PrivateKey: key, Leaf: leaf}
}

// retiredRootAttack presents the web workload's still-valid certificate
// after `meshca root prepare`, `activate --force` and `retire --force`
// took the root that signed it out of the bundle: the handshake refuses
// it. It must run last, as it rotates the server's root.
func (a *arena) retiredRootAttack(t *testing.T) attack {
	return attack{name: "mtls/certificate from a retired root", before: a.retireRoot, transport: true,
		code: codes.Unavailable, msg: "tls: unknown certificate authority",
		do: a.do(probe{cert: a.webCert, tls12: true, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID), ValidityDuration: 86400}})}
}

// retireRoot retires the server's root and waits until the server serves
// the new one alone.
func (a *arena) retireRoot(t *testing.T) {
	t.Helper()
	st, why := "--state-dir="+a.s.stateDir, "attack matrix: retire the root of a live leaf"
	for _, step := range [][]string{{"prepare", st, "--reason", why}, {"activate", st, "--force", "--reason", why}, {"retire", st, "--force", "--reason", why}} {
		if out, code := rootStep(t, step...); code != 0 {
			t.Fatalf("meshca root %s: exit %d\n%s", step[0], code, out)
		}
	}
	roots, _, err := harness.RootBundle(context.Background(), bin, "--state-dir", a.s.stateDir)
	if err != nil || len(roots) != 1 {
		t.Fatalf("bundle after retire: %d roots, %v", len(roots), err)
	}
	if a.webCert.Leaf.CheckSignatureFrom(roots[0]) == nil {
		t.Fatal("the new root signed the web workload's certificate")
	}
	a.roots = certs.Pool(roots...)
	c, err := checked.NewClient(t, caclient.Config{Addr: a.s.Addr, ServerName: "istiod.istio-system.svc", Roots: a.roots,
		TokenFile: harness.WriteToken(t, a.web.Token), ClusterID: authpb.DefaultClusterID})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		svid, err := c.Fetch(context.Background(), a.webID, caclient.Options{})
		if err == nil && len(svid.Roots) == 1 && svid.Roots[0].Equal(roots[0]) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not serve the new root alone within 15s: %v", err)
		}
	}
}

// accepted are the requests that look hostile but that the wire contract
// says to serve, and controls showing that the credentials the attacks
// misuse work when used as meant.
func (a *arena) accepted(t *testing.T) []acceptance {
	const day = 24 * time.Hour
	many := &structpb.Struct{Fields: map[string]*structpb.Value{"CertSigner": structpb.NewStringValue("")}}
	for i := range 200 {
		many.Fields[string(rune('a'+i%26))+time.Duration(i).String()] = structpb.NewStringValue("CA_HEADER value")
	}
	web, z := a.web.Token, a.ztunnelA.Token
	day24, err := a.s.client(t, web).Fetch(context.Background(), a.webID, caclient.Options{TTL: day})
	if err != nil {
		t.Fatal(err)
	}
	dayCert := day24.TLSCertificate()
	imp := meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(a.webID.String()))
	return []acceptance{
		{name: "accepted/control: own identity by token", token: web, ttl: 86400, lifetime: day},
		{name: "accepted/control: ztunnel impersonates a workload on its node", token: z, meta: imp, lifetime: day},
		// Issue 22: a renewal gets no longer than the certificate it
		// presents, webCert's hour (NotAfter less NotBefore, backdate
		// included, so it ends an hour from now), whatever it asks for; a
		// 24 h one renews into 24 h, backdate included, never past
		// --default-ttl.
		{name: "accepted/control: renewal by client certificate gets its hour", cert: a.webCert, ttl: 86400, lifetime: time.Hour},
		{name: "accepted/renewal asking for 90 days gets its hour", cert: a.webCert, ttl: 90 * 86400, lifetime: time.Hour},
		{name: "accepted/renewal of a 24h certificate asking for 90 days gets 24h", cert: dayCert, ttl: 90 * 86400, lifetime: day - certs.Backdate},
		// Wire contract: validity_duration <= 0 asks for the default TTL.
		{name: "accepted/TTL zero gets the default", token: web, ttl: 0, lifetime: day},
		{name: "accepted/TTL -1 gets the default", token: web, ttl: -1, lifetime: day},
		{name: "accepted/TTL int64 minimum gets the default", token: web, ttl: -1 << 63, lifetime: day},
		// Wire contract: unknown fields are ignored, an empty CertSigner
		// never fails a request (a named one is refused: metadataAttacks).
		{name: "accepted/200 unknown keys and an empty CertSigner", token: web, meta: many, lifetime: day},
		{name: "accepted/nested values under an unknown key", token: web, lifetime: day, meta: meta("x", nested(100))},
	}
}
