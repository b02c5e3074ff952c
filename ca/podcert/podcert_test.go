package podcert_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/podcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

const signerName = "meshca.io/svid"

var now = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

// fakeIssuer signs with a fixed lifetime, or fails with err.
type fakeIssuer struct {
	mu        sync.Mutex
	err       error
	backdate  time.Duration
	issued    int
	decisions []*podcert.Decision
}

func (f *fakeIssuer) IssuePod(_ context.Context, r *podcert.IssueRequest) (*podcert.Issued, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	f.issued++
	nb := now.Add(-f.backdate).Truncate(time.Second)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(int64(f.issued)), NotBefore: nb, NotAfter: nb.Add(r.Lifetime)}
	return &podcert.Issued{Leaf: leaf, ChainPEM: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"}, nil
}

func (f *fakeIssuer) RecordPod(_ context.Context, d *podcert.Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisions = append(f.decisions, d)
}

func objects(mutate func(pod *corev1.Pod, pcr *certv1.PodCertificateRequest)) []runtime.Object {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: "pod-uid"},
		Spec: corev1.PodSpec{ServiceAccountName: "cart", NodeName: "node-a"}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", UID: "sa-uid"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"mesh": "on"}}}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stub, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{}}, key)
	max := int32(7200)
	pcr := &certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1-abc"},
		Spec: certv1.PodCertificateRequestSpec{SignerName: signerName, PodName: "cart-1", PodUID: "pod-uid",
			ServiceAccountName: "cart", ServiceAccountUID: "sa-uid", NodeName: "node-a", NodeUID: "node-uid",
			MaxExpirationSeconds: &max, StubPKCS10Request: stub}}
	mutate(pod, pcr)
	out := []runtime.Object{sa, node, ns, pcr}
	if pod.Name != "" {
		out = append(out, pod)
	}
	return out
}

func TestController(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*corev1.Pod, *certv1.PodCertificateRequest)
		issuerErr error
		selector  string
		cond      string // "" means no answer
		reason    string
		msg       string
		word      string
	}{
		{name: "issued", cond: "Issued", reason: "Issued", msg: "issued spiffe://cluster.local/ns/shop/sa/cart", word: "ok"},
		{name: "pod gone", mutate: func(p *corev1.Pod, _ *certv1.PodCertificateRequest) { p.Name = "" },
			cond: "Denied", reason: "PodNotFound", msg: "pod shop/cart-1 no longer exists", word: "pod_gone"},
		{name: "pod replaced", mutate: func(p *corev1.Pod, _ *certv1.PodCertificateRequest) { p.UID = "other" },
			cond: "Denied", reason: "PodReplaced", msg: "pod shop/cart-1 is now UID other, not the requesting UID pod-uid", word: "pod_replaced"},
		{name: "pod being deleted, still draining", mutate: func(p *corev1.Pod, _ *certv1.PodCertificateRequest) { p.DeletionTimestamp = &metav1.Time{Time: now} },
			cond: "Issued", reason: "Issued", msg: "issued spiffe://cluster.local/ns/shop/sa/cart", word: "ok"},
		{name: "pod terminated", mutate: func(p *corev1.Pod, _ *certv1.PodCertificateRequest) { p.Status.Phase = corev1.PodSucceeded },
			cond: "Denied", reason: "PodTerminating", msg: "pod shop/cart-1 has terminated (Succeeded)", word: "pod_terminating"},
		{name: "service account replaced", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) { r.Spec.ServiceAccountUID = "old" },
			cond: "Denied", reason: "ServiceAccountMismatch", msg: "service account shop/cart with UID old no longer exists", word: "service_account_mismatch"},
		{name: "node replaced", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) { r.Spec.NodeUID = "old" },
			cond: "Denied", reason: "NodeMismatch", msg: "node node-a with UID old no longer exists", word: "node_mismatch"},
		{name: "namespace not selected", selector: "mesh=off",
			cond: "Denied", reason: "NamespaceNotAllowed", msg: `namespace shop is not selected by meshca's pod certificate namespace selector "mesh=off"`, word: "namespace_not_allowed"},
		{name: "user annotations", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) {
			r.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/x": "y"}
		}, cond: "Denied", reason: "InvalidUnverifiedUserAnnotations", msg: "takes no unverifiedUserAnnotations", word: "user_annotations"},
		{name: "key type", issuerErr: &csr.Error{Reason: csr.ReasonKey, Detail: "ECDSA curve P-521 is not allowed (allowed: ECDSA P-256, Ed25519)"},
			cond: "Denied", reason: "UnsupportedKeyType", msg: "meshca does not sign this key type: ECDSA curve P-521 is not allowed (allowed: ECDSA P-256, Ed25519)", word: "csr_key_policy"},
		{name: "max expiration under an hour", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) {
			short := int32(1800)
			r.Spec.MaxExpirationSeconds = &short
		}, cond: "Denied", reason: "InvalidRequest", msg: "spec.maxExpirationSeconds 1800 is under the API's minimum lifetime of 3600 seconds", word: "max_expiration_too_short"},
		{name: "backend refused", issuerErr: &signer.Error{Backend: "vault", Kind: signer.KindRefused, Err: errors.New("role")},
			cond: "Failed", reason: "SignerRefused", msg: "the signing backend refused the request", word: "signer_refused"},
		{name: "backend unavailable: retried", issuerErr: &signer.Error{Backend: "vault", Kind: signer.KindUnavailable, Err: errors.New("sealed")}},
		{name: "other signer", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) { r.Spec.SignerName = "example.com/other" }},
		{name: "already answered", mutate: func(_ *corev1.Pod, r *certv1.PodCertificateRequest) {
			r.Status.Conditions = []metav1.Condition{{Type: "Issued", Status: metav1.ConditionTrue, Reason: "Issued"}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mutate := tt.mutate
			if mutate == nil {
				mutate = func(*corev1.Pod, *certv1.PodCertificateRequest) {}
			}
			client := fake.NewClientset(objects(mutate)...)
			iss := &fakeIssuer{err: tt.issuerErr, backdate: 2 * time.Minute}
			sel := labels.Everything()
			if tt.selector != "" {
				sel = labels.SelectorFromSet(labels.Set{"mesh": "off"})
			}
			ctl, err := podcert.New(podcert.Config{Client: client, SignerName: signerName, TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"),
				Issuer: iss, Namespaces: sel, Now: func() time.Time { return now }, Jitter: func() float64 { return 0.5 }})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- ctl.Run(ctx) }()
			var got *certv1.PodCertificateRequest
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				got, _ = client.CertificatesV1().PodCertificateRequests("shop").Get(ctx, "cart-1-abc", metav1.GetOptions{})
				if tt.cond != "" && podcert.Answered(got) || tt.cond == "" && time.Until(deadline) < 4*time.Second {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if tt.cond == "" {
				if len(iss.decisions) != 0 || (tt.name != "already answered" && len(got.Status.Conditions) != 0) {
					t.Fatalf("answered: %+v, decisions %v", got.Status, iss.decisions)
				}
				return
			}
			c := got.Status.Conditions
			if len(c) != 1 || c[0].Type != tt.cond || c[0].Reason != tt.reason || !strings.Contains(c[0].Message, tt.msg) {
				t.Fatalf("conditions %+v, want %s/%s containing %q", c, tt.cond, tt.reason, tt.msg)
			}
			if len(iss.decisions) != 1 || iss.decisions[0].Reason != tt.word || iss.decisions[0].Condition != tt.cond {
				t.Fatalf("decisions %+v, want one %s", iss.decisions, tt.word)
			}
			if tt.cond != "Issued" {
				if tt.cond == "Denied" && iss.issued != 0 {
					t.Fatalf("a Denied request was signed %d times", iss.issued)
				}
				return
			}
			st := got.Status
			if life := st.NotAfter.Sub(st.NotBefore.Time); life != 2*time.Hour {
				t.Errorf("lifetime %v, want exactly maxExpirationSeconds (2h)", life)
			}
			if want := st.NotBefore.Add(time.Hour); !st.BeginRefreshAt.Time.Equal(want) {
				t.Errorf("beginRefreshAt %v, want half the lifetime %v", st.BeginRefreshAt.Time, want)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	client := fake.NewClientset()
	tests := []struct {
		name string
		c    podcert.Config
		want string
	}{
		{"no client", podcert.Config{SignerName: signerName, TrustDomain: td, Issuer: &fakeIssuer{}}, "podcert: config: Client is required"},
		{"no signer", podcert.Config{Client: client, TrustDomain: td, Issuer: &fakeIssuer{}}, "podcert: config: SignerName is required"},
		{"no issuer", podcert.Config{Client: client, SignerName: signerName, TrustDomain: td}, "podcert: config: Issuer is required"},
		{"short", podcert.Config{Client: client, SignerName: signerName, TrustDomain: td, Issuer: &fakeIssuer{}, MaxTTL: time.Hour - time.Second},
			"podcert: config: MaxTTL 59m59s is less than the API's minimum lifetime 1h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := podcert.New(tt.c); err == nil || err.Error() != tt.want {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// slowIssuer signs as fakeIssuer, once release is closed; started is
// closed when the first signature begins.
type slowIssuer struct {
	*fakeIssuer
	once             sync.Once
	started, release chan struct{}
}

func (s *slowIssuer) IssuePod(ctx context.Context, r *podcert.IssueRequest) (*podcert.Issued, error) {
	s.once.Do(func() { close(s.started) })
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.fakeIssuer.IssuePod(ctx, r)
}

// TestRunFinishesInFlight: a request being signed when Run's context ends
// (the leader terminated, a rolling update) is answered to the end and
// delivered before Run returns, so that the Lease, released then, hands
// no signed request over to be signed again.
func TestRunFinishesInFlight(t *testing.T) {
	client := fake.NewClientset(objects(func(*corev1.Pod, *certv1.PodCertificateRequest) {})...)
	iss := &slowIssuer{fakeIssuer: &fakeIssuer{}, started: make(chan struct{}), release: make(chan struct{})}
	ctl, err := podcert.New(podcert.Config{Client: client, SignerName: signerName, TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"),
		Issuer: iss, Now: func() time.Time { return now }, Jitter: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	select {
	case <-iss.started:
	case <-time.After(5 * time.Second):
		t.Fatal("the request was never signed")
	}
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) with a signature in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(iss.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(podcert.ShutdownGrace):
		t.Fatal("Run did not return once the signature in flight was delivered")
	}
	got, err := client.CertificatesV1().PodCertificateRequests("shop").Get(context.Background(), "cart-1-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Status.Conditions; len(c) != 1 || c[0].Type != "Issued" {
		t.Fatalf("status %+v, want Issued", got.Status)
	}
}
