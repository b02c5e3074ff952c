package podcert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
)

// fuzzNow is the controller's clock in the fuzz target.
var fuzzNow = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// fuzzBackdate is how far before now the fuzz backend starts a
// certificate.
const fuzzBackdate = 5 * time.Minute

// fuzzCluster is what the fuzz target's apiserver holds: namespace shop
// is selected (mesh=on), dev is not; in shop, Pod cart-1 runs as
// service account cart on node-a, cart-done has succeeded and cart-old
// is being deleted.
func fuzzCluster() []runtime.Object {
	pod := func(name, uid string, phase corev1.PodPhase, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid)},
			Spec: corev1.PodSpec{ServiceAccountName: "cart", NodeName: "node-a"}, Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{Time: fuzzNow}
		}
		return p
	}
	return []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"mesh": "on"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dev"}},
		pod("cart-1", "pod-uid", corev1.PodRunning, false),
		pod("cart-done", "done-uid", corev1.PodSucceeded, false),
		pod("cart-old", "old-uid", corev1.PodRunning, true),
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", UID: "sa-uid"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}},
	}
}

// wantRefusal is the reason of the Denied condition the checks before
// signing give r in fuzzCluster, or "" when they pass: the order and the
// rules of check, written out against the cluster's contents.
func wantRefusal(r *certv1.PodCertificateRequest) string {
	s := r.Spec
	exists := s.PodName == "cart-1" || s.PodName == "cart-done" || s.PodName == "cart-old"
	podUID := map[string]types.UID{"cart-1": "pod-uid", "cart-done": "done-uid", "cart-old": "old-uid"}[s.PodName]
	switch {
	case len(s.UnverifiedUserAnnotations) > 0:
		return certv1.PodCertificateRequestConditionInvalidUserConfig
	case r.Namespace != "shop":
		return ReasonNamespaceNotAllowed
	case !exists:
		return ReasonPodNotFound
	case s.PodUID != podUID:
		return ReasonPodReplaced
	case s.PodName == "cart-done":
		return ReasonPodTerminating
	case s.ServiceAccountName != "cart":
		return ReasonServiceAccount
	case s.NodeName != "node-a":
		return ReasonNode
	case s.ServiceAccountUID != "sa-uid":
		return ReasonServiceAccount
	case s.NodeUID != "node-uid":
		return ReasonNode
	}
	return ""
}

// Backends the fuzz issuer plays, after the key policy.
const (
	backendIssues = iota
	backendUnavailable
	backendRefused
	backendFails
	backendTimesOut
	backends
)

// fuzzIssuer does what ca.PodIssuer does with the stub (csr.ParseFor
// with the default key policy), then answers as backend says: a
// certificate for the stub's key from now less fuzzBackdate for the
// requested Lifetime plus skew, or a failure.
type fuzzIssuer struct {
	backend int
	skew    time.Duration
	calls   int
	got     *IssueRequest
	leaf    *x509.Certificate
}

func (f *fuzzIssuer) IssuePod(_ context.Context, r *IssueRequest) (*Issued, error) {
	f.calls++
	f.got = &IssueRequest{StubPKCS10: bytes.Clone(r.StubPKCS10), ID: r.ID, Lifetime: r.Lifetime}
	policy := csr.DefaultKeyPolicy()
	req, err := csr.ParseFor(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: r.StubPKCS10}), &policy)
	if err != nil {
		return nil, err
	}
	switch f.backend {
	case backendUnavailable:
		return nil, signer.Errorf("vault", signer.KindUnavailable, "sealed")
	case backendRefused:
		return nil, signer.Errorf("vault", signer.KindRefused, "role does not allow the SAN")
	case backendFails:
		return nil, errors.New("ca: issued certificate failed verification: x509: certificate signed by unknown authority")
	case backendTimesOut:
		return nil, signer.Errorf("vault", signer.KindInternal, "sign: %w", context.DeadlineExceeded)
	}
	f.leaf = &x509.Certificate{SerialNumber: big.NewInt(1), PublicKey: req.PublicKey,
		NotBefore: fuzzNow.Add(-fuzzBackdate), NotAfter: fuzzNow.Add(-fuzzBackdate + r.Lifetime + f.skew)}
	return &Issued{Leaf: f.leaf, ChainPEM: "leaf and intermediates\n"}, nil
}

func (*fuzzIssuer) RecordPod(context.Context, *Decision) {}

// fuzzStub is a stub CSR as the kubelet makes it: an empty subject, only
// the key.
func fuzzStub(tb testing.TB, key crypto.Signer) []byte {
	tb.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		tb.Fatal(err)
	}
	return der
}

// pointers are the addresses encoding/asn1 prints in some of its errors
// (the tag of its field parameters), which differ from one parse to the
// next.
var pointers = regexp.MustCompile(`0x[0-9a-f]+`)

// clip cuts s to the 253 bytes of a Kubernetes name: the apiserver stores
// nothing longer in the fields the fuzz target fills.
func clip(s string) string { return s[:min(len(s), 253)] }

// FuzzDecide feeds the PodCertificateRequest controller any request for
// its signer name, spec fields, stubPKCS10Request and
// maxExpirationSeconds included, against a fixed cluster, and any answer
// of the backend; decide reads it as sync does. Nothing may panic, and:
//
//   - decide returns an error (no answer: retried) only when the backend
//     is unavailable, timed out, or failed fewer than maxFailedAttempts
//     times; every answer is one condition the apiserver accepts
//     (metav1 condition validation), of type Issued, Denied or Failed,
//     at the request's generation, and the decision records it;
//   - a request that carries user annotations, or whose namespace, Pod,
//     service account or node is not the live one, is Denied with the
//     reason of the first check it fails, and nothing is signed;
//   - a request that no certificate can satisfy, maxExpirationSeconds
//     under the API's minimum lifetime, is Denied without signing;
//   - otherwise IssuePod gets the stub as it is, the Pod's SPIFFE ID, and
//     a Lifetime within [MinLifetime, min(maxExpirationSeconds, MaxTTL)];
//   - a stub whose key the key policy refuses is Denied with
//     UnsupportedKeyType and the policy's detail; any other stub the CSR
//     parser refuses is Denied with InvalidRequest;
//   - a refusing backend is Failed (SignerRefused), a failing one Failed
//     (SigningFailed) at the last attempt;
//   - a certificate is Issued, with its own validity and a beginRefreshAt
//     in whole seconds at least 10 minutes from either end, exactly when
//     its lifetime is within [MinLifetime, maxExpirationSeconds]; any
//     other is Failed (LifetimeOutOfRange), recorded with its leaf (for
//     its serial) but without it in the status; no other refusal records
//     a leaf.
//     A backend that issues the Lifetime asked gets an Issued answer.
func FuzzDecide(f *testing.F) {
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		f.Fatal(err)
	}
	good := fuzzStub(f, p256)
	forged := bytes.Clone(good)
	forged[len(forged)-3] ^= 0xff
	type seed struct {
		ns, pod, podUID, sa, saUID, node, nodeUID, annotation string
		maxSeconds                                            int32
		hasMax                                                bool
		stub                                                  []byte
		backend                                               uint8
		skew                                                  int32
		attempts                                              uint8
		jitter                                                float64
	}
	ok := seed{"shop", "cart-1", "pod-uid", "cart", "sa-uid", "node-a", "node-uid", "", 7200, true, good, backendIssues, 0, 0, 0.5}
	seeds := []func(*seed){
		func(*seed) {},
		func(s *seed) { s.hasMax = false },
		func(s *seed) { s.maxSeconds = 3600 },
		func(s *seed) { s.maxSeconds = 7862400 },
		func(s *seed) { s.stub = fuzzStub(f, ed) },
		func(s *seed) { s.stub = fuzzStub(f, p521) },
		func(s *seed) { s.stub = fuzzStub(f, rsa1024) },
		func(s *seed) { s.stub = forged },
		func(s *seed) { s.stub = []byte("not DER") },
		func(s *seed) { s.skew = 3600 },
		func(s *seed) { s.skew = -3000 },
		func(s *seed) { s.backend = backendUnavailable },
		func(s *seed) { s.backend = backendRefused },
		func(s *seed) { s.backend, s.attempts = backendFails, maxFailedAttempts-1 },
		func(s *seed) { s.backend = backendFails },
		func(s *seed) { s.backend = backendTimesOut },
		func(s *seed) { s.annotation = "example.com/x" },
		func(s *seed) { s.ns = "dev" },
		func(s *seed) { s.pod = "cart-2" },
		func(s *seed) { s.podUID = "other" },
		func(s *seed) { s.pod, s.podUID = "cart-done", "done-uid" },
		func(s *seed) { s.pod, s.podUID = "cart-old", "old-uid" },
		func(s *seed) { s.sa = "admin" },
		func(s *seed) { s.saUID = "old" },
		func(s *seed) { s.node = "node-b" },
		func(s *seed) { s.nodeUID = "old" },
		func(s *seed) { s.jitter = 0.999 },
	}
	for _, mutate := range seeds {
		s := ok
		mutate(&s)
		f.Add(s.ns, s.pod, s.podUID, s.sa, s.saUID, s.node, s.nodeUID, s.annotation, s.maxSeconds, s.hasMax, s.stub, s.backend, s.skew, s.attempts, s.jitter)
	}

	iss := &fuzzIssuer{}
	var jitter float64
	ctl, err := New(Config{Client: fake.NewClientset(fuzzCluster()...), SignerName: "meshca.io/svid",
		TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"), Issuer: iss,
		Namespaces: labels.SelectorFromSet(labels.Set{"mesh": "on"}),
		Now:        func() time.Time { return fuzzNow }, Jitter: func() float64 { return jitter }})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, ns, pod, podUID, sa, saUID, node, nodeUID, annotation string,
		maxSeconds int32, hasMax bool, stub []byte, backend uint8, skew int32, attempts uint8, j float64) {
		*iss = fuzzIssuer{backend: int(backend % backends), skew: time.Duration(skew) * time.Second}
		jitter = math.Abs(math.Mod(j, 1))
		if math.IsNaN(jitter) {
			jitter = 0
		}
		r := &certv1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: clip(ns), Name: "req", Generation: 3},
			Spec: certv1.PodCertificateRequestSpec{SignerName: "meshca.io/svid", PodName: clip(pod), PodUID: types.UID(clip(podUID)),
				ServiceAccountName: clip(sa), ServiceAccountUID: types.UID(clip(saUID)),
				NodeName: types.NodeName(clip(node)), NodeUID: types.UID(clip(nodeUID)), StubPKCS10Request: stub}}
		if hasMax {
			r.Spec.MaxExpirationSeconds = &maxSeconds
		}
		if annotation != "" {
			r.Spec.UnverifiedUserAnnotations = map[string]string{clip(annotation): "on"}
		}
		maxLife := time.Duration(defaultMaxExpiration) * time.Second
		if hasMax {
			maxLife = time.Duration(maxSeconds) * time.Second
		}

		d := &Decision{Request: r}
		status, err := ctl.decide(context.Background(), r, d, int(attempts))
		identity := wantRefusal(r)
		if identity != "" && iss.calls != 0 {
			t.Fatalf("signed a request the checks refuse (%s)", identity)
		}
		if identity == "" && maxLife < MinLifetime && iss.calls != 0 {
			t.Fatalf("signed a request whose maxExpirationSeconds (%v) no certificate can satisfy", maxLife)
		}
		if iss.calls > 1 {
			t.Fatalf("IssuePod called %d times", iss.calls)
		}
		if iss.calls == 1 {
			g := iss.got
			if !bytes.Equal(g.StubPKCS10, stub) {
				t.Fatal("IssuePod got another stub than spec.stubPKCS10Request")
			}
			if want := "spiffe://cluster.local/ns/" + r.Namespace + "/sa/" + r.Spec.ServiceAccountName; g.ID.String() != want {
				t.Fatalf("IssuePod got the identity %s, want %s", g.ID, want)
			}
			if life := g.Lifetime; life < MinLifetime || life > min(maxLife, ctl.c.MaxTTL) {
				t.Fatalf("IssuePod asked for a lifetime of %v, outside [%v, min(%v, %v)]", life, MinLifetime, maxLife, ctl.c.MaxTTL)
			}
		}

		policy := csr.DefaultKeyPolicy()
		_, stubErr := csr.ParseFor(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: stub}), &policy)
		var ce *csr.Error
		if stubErr != nil && !errors.As(stubErr, &ce) {
			t.Fatalf("csr.ParseFor: %v is not a *csr.Error", stubErr)
		}
		signs := identity == "" && maxLife >= MinLifetime && stubErr == nil
		retry := signs && (iss.backend == backendUnavailable || iss.backend == backendTimesOut ||
			iss.backend == backendFails && int(attempts)+1 < maxFailedAttempts)
		if retry != (err != nil) || err != nil && status != nil {
			t.Fatalf("decide = %v, %v; want a retry: %v", status, err, retry)
		}
		if err != nil {
			return
		}
		if errs := metav1validation.ValidateConditions(status.Conditions, field.NewPath("status", "conditions")); len(status.Conditions) != 1 || len(errs) != 0 {
			t.Fatalf("conditions %+v: want one the apiserver takes: %v", status.Conditions, errs.ToAggregate())
		}
		c := status.Conditions[0]
		if c.Status != metav1.ConditionTrue || c.ObservedGeneration != r.Generation || c.Type != d.Condition || d.Reason == "" {
			t.Fatalf("condition %+v, decision %s/%s", c, d.Condition, d.Reason)
		}
		want := func(typ, reason string, in ...string) {
			t.Helper()
			if c.Type != typ || c.Reason != reason {
				t.Fatalf("answer %s/%s (%q), want %s/%s", c.Type, c.Reason, c.Message, typ, reason)
			}
			for _, s := range in {
				if !strings.Contains(pointers.ReplaceAllString(c.Message, "0x…"), pointers.ReplaceAllString(s, "0x…")) {
					t.Fatalf("message %q does not say %q", c.Message, s)
				}
			}
			if typ == certv1.PodCertificateRequestConditionTypeIssued {
				return
			}
			if status.CertificateChain != "" || status.NotAfter != nil {
				t.Fatalf("a %s answer carries a certificate", typ)
			}
			if signed := reason == ReasonLifetime; (d.Leaf != nil) != signed || signed && d.Leaf != iss.leaf {
				t.Fatalf("a %s/%s decision records the leaf %v: want the one signed exactly when it was signed", typ, reason, d.Leaf)
			}
		}
		switch {
		case identity != "":
			want(certv1.PodCertificateRequestConditionTypeDenied, identity)
		case maxLife < MinLifetime:
			want(certv1.PodCertificateRequestConditionTypeDenied, ReasonInvalidRequest, "maxExpirationSeconds")
		case ce != nil && ce.Reason == csr.ReasonKey:
			want(certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionUnsupportedKeyType, ce.Detail)
		case ce != nil:
			want(certv1.PodCertificateRequestConditionTypeDenied, ReasonInvalidRequest, ce.Detail)
			if d.Reason != "csr_"+string(ce.Reason) {
				t.Fatalf("decision reason %q for a %s stub", d.Reason, ce.Reason)
			}
		case iss.backend == backendRefused:
			want(certv1.PodCertificateRequestConditionTypeFailed, ReasonSignerRefused)
		case iss.backend == backendFails:
			want(certv1.PodCertificateRequestConditionTypeFailed, ReasonSigningFailed)
		default:
			nb, na := iss.leaf.NotBefore, iss.leaf.NotAfter
			if life := na.Sub(nb); life < MinLifetime || life > maxLife {
				want(certv1.PodCertificateRequestConditionTypeFailed, ReasonLifetime, fmt.Sprint(life))
				return
			}
			want(certv1.PodCertificateRequestConditionTypeIssued, ReasonIssued, iss.got.ID.String())
			if d.Leaf != iss.leaf || status.CertificateChain != "leaf and intermediates\n" ||
				!status.NotBefore.Time.Equal(nb) || !status.NotAfter.Time.Equal(na) {
				t.Fatalf("Issued status %+v does not carry the certificate issued (%v to %v)", status, nb, na)
			}
			refresh := status.BeginRefreshAt.Time
			if refresh.Before(nb.Add(refreshMargin)) || refresh.After(na.Add(-refreshMargin)) || !refresh.Equal(refresh.Truncate(time.Second)) {
				t.Fatalf("beginRefreshAt %v: want whole seconds within [%v, %v]", refresh, nb.Add(refreshMargin), na.Add(-refreshMargin))
			}
		}
		if iss.backend == backendIssues && iss.skew == 0 && signs && c.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Fatalf("a certificate of the lifetime asked was not Issued: %s/%s %q", c.Type, c.Reason, c.Message)
		}
	})
}
