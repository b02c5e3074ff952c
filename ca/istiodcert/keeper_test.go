package istiodcert

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var names = []string{"istiod.istio-system.svc"}

// testOwner is the test keeper's mark.
const testOwner = "meshca-system/meshca-istiod-cert"

// ca is the test's CA: an authority that signs, the bundle in service, a
// clock; issue through the built-in signer, as the CA's path would.
type testCA struct {
	mgr    *keymgr.Manager
	mu     sync.Mutex
	bundle []*x509.Certificate
	now    time.Time
	issued atomic.Int32
	fail   error
}

func (c *testCA) IssueDNS(ctx context.Context, r *IssueRequest) (*Issued, error) {
	if c.fail != nil {
		return nil, c.fail
	}
	req, err := csr.Parse(r.CSR)
	if err != nil {
		return nil, err
	}
	if err := csr.DefaultPolicy().CheckDNS(req, r.DNSNames); err != nil {
		return nil, err
	}
	s := local.New(local.Config{Authorities: c.mgr, Now: func() time.Time { return c.now }})
	res, err := s.Sign(ctx, &signer.Request{CSR: req, DNSNames: r.DNSNames, TTL: r.TTL, Usages: csr.WorkloadUsages(req.PublicKey)})
	if err != nil {
		return nil, err
	}
	c.issued.Add(1)
	return &Issued{Leaf: res.Leaf, Intermediates: res.Intermediates, Roots: c.roots()}, nil
}

func (c *testCA) roots() []*x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundle
}

func (c *testCA) setRoots(roots ...*x509.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bundle = roots
}

func newTest(t *testing.T) (*Keeper, *testCA, *fake.Clientset, *testca.CA) {
	t.Helper()
	root := testca.NewRoot(t, "root A", testca.Options{})
	inter := root.NewIntermediate(t, "issuing A", testca.Options{})
	tc := &testCA{mgr: keymgr.NewManager(spiffeid.RequireTrustDomainFromString("cluster.local"), inter.Authority()),
		bundle: []*x509.Certificate{root.Cert}, now: time.Now()}
	client := fake.NewClientset()
	k, err := New(Config{Client: client, Namespace: "istio-system", Name: "istiod-tls", Owner: testOwner, Names: names, TTL: time.Hour,
		Issuer: tc, Bundle: tc.roots,
		Signing: func() *x509.Certificate { return tc.mgr.Authority().Cert },
		Now:     func() time.Time { return tc.now }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return k, tc, client, root
}

// look runs one look of the keeper on what the apiserver holds now.
func look(t *testing.T, k *Keeper, client *fake.Clientset) *Held {
	t.Helper()
	cur, err := client.CoreV1().Secrets("istio-system").Get(context.Background(), "istiod-tls", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cur = nil
	} else if err != nil {
		t.Fatal(err)
	}
	k.keep(context.Background(), cur)
	s, err := client.CoreV1().Secrets("istio-system").Get(context.Background(), "istiod-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return Parse(s)
}

// TestKeeperFollowsTheCA: the Secret is created, left alone while it
// matches, and written anew, with a fresh key, when the bundle changes
// (prepare, retire), when another authority signs (activate), and at two
// thirds of its life; each leaf verifies to the roots of its ca.crt.
func TestKeeperFollowsTheCA(t *testing.T) {
	k, tc, client, rootA := newTest(t)
	first := look(t, k, client)
	if tc.issued.Load() != 1 || first.Leaf() == nil || !first.KeyMatches {
		t.Fatalf("first look: issued %d, held %+v", tc.issued.Load(), first)
	}
	if got := decide(first, k.now()); got != "" {
		t.Fatalf("a fresh Secret is due again: %s", got)
	}
	look(t, k, client)
	if tc.issued.Load() != 1 {
		t.Fatalf("issued %d times for an unchanged CA, want 1", tc.issued.Load())
	}

	// prepare: a second root joins the bundle.
	rootB := testca.NewRoot(t, "root B", testca.Options{})
	tc.setRoots(rootA.Cert, rootB.Cert)
	prepared := look(t, k, client)
	if !sameCerts(prepared.Roots, tc.roots()) || prepared.Leaf().Equal(first.Leaf()) {
		t.Fatalf("after prepare: ca.crt has %d roots, leaf reissued %v", len(prepared.Roots), !prepared.Leaf().Equal(first.Leaf()))
	}
	if csr.SamePublicKey(prepared.Leaf().PublicKey, first.Leaf().PublicKey) {
		t.Fatal("the reissued leaf kept the old key")
	}

	// activate: B's authority signs.
	tc.mgr.Set(rootB.Authority(rootA.Cert, rootB.Cert))
	activated := look(t, k, client)
	if activated.Leaf().CheckSignatureFrom(rootB.Cert) != nil {
		t.Fatal("after activate the leaf is not issued under the new authority")
	}
	if activated.IssuedUnder != keymgr.Fingerprint(rootB.Cert) {
		t.Fatalf("issued-under %q, want B's fingerprint", activated.IssuedUnder)
	}

	// retire: A leaves the bundle.
	tc.setRoots(rootB.Cert)
	retired := look(t, k, client)
	if !sameCerts(retired.Roots, []*x509.Certificate{rootB.Cert}) || !verifies(retired.Chain, retired.Roots, tc.now) {
		t.Fatal("after retire ca.crt is not B alone, or the leaf does not verify to it")
	}

	// renewal at two thirds of its life.
	n := tc.issued.Load()
	tc.now = RenewAt(retired.Leaf()).Add(-time.Second)
	look(t, k, client)
	if tc.issued.Load() != n {
		t.Fatal("renewed before two thirds of its life")
	}
	tc.now = RenewAt(retired.Leaf())
	renewed := look(t, k, client)
	if tc.issued.Load() != n+1 || renewed.Leaf().Equal(retired.Leaf()) {
		t.Fatal("not renewed at two thirds of its life")
	}

	// a revision's name added.
	k.c.Names = []string{names[0], "istiod-canary.istio-system.svc"}
	if got := decide(renewed, k.now()); got != ReasonNamesChanged {
		t.Fatalf("decide = %q, want %q", got, ReasonNamesChanged)
	}
	if h := look(t, k, client); !sameNames(h.Leaf().DNSNames, k.c.Names) {
		t.Fatalf("names %v, want %v", h.Leaf().DNSNames, k.c.Names)
	}
}

// TestKeeperRepairs: a Secret someone edited is written anew, and keys
// meshca did not write are dropped; a CA that cannot issue leaves the
// Secret as it is.
func TestKeeperRepairs(t *testing.T) {
	k, tc, client, _ := newTest(t)
	look(t, k, client)
	ctx := context.Background()
	edit := func(f func(*corev1.Secret)) {
		s, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
		f(s)
		if _, err := client.CoreV1().Secrets("istio-system").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	other := testca.NewRoot(t, "someone else's", testca.Options{})
	otherKey, _ := pemutil.EncodePrivateKey(other.Key)
	tests := []struct {
		name string
		edit func(*corev1.Secret)
		want string
	}{
		{"another key", func(s *corev1.Secret) { s.Data[KeyKey] = otherKey }, ReasonKeyMismatch},
		{"no certificate", func(s *corev1.Secret) { delete(s.Data, KeyCert) }, ReasonMissing},
		{"extra root", func(s *corev1.Secret) {
			s.Data[KeyRoots] = append(s.Data[KeyRoots], pemutil.EncodeCertificates(other.Cert)...)
		}, ReasonRootsChanged},
		{"another certificate", func(s *corev1.Secret) {
			s.Data[KeyCert] = pemutil.EncodeCertificates(other.Leaf(t, "", func(c *x509.Certificate) { c.URIs, c.DNSNames = nil, names }))
			s.Data[KeyKey] = otherKey
		}, ReasonKeyMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			edit(func(s *corev1.Secret) { s.Data["extra"] = []byte("tenant's"); tt.edit(s) })
			s, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
			if got := decide(Parse(s), k.now()); got != tt.want {
				t.Fatalf("decide = %q, want %q", got, tt.want)
			}
			h := look(t, k, client)
			if decide(h, k.now()) != "" {
				t.Fatal("not repaired")
			}
			s, _ = client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
			if _, ok := s.Data["extra"]; ok || len(s.Data) != 3 {
				t.Fatalf("keys %v, want exactly tls.crt, tls.key, ca.crt", keys(s.Data))
			}
		})
	}

	tc.fail = errors.New("backend down")
	edit(func(s *corev1.Secret) { delete(s.Data, KeyCert) })
	before, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	if wait := k.keep(ctx, before); wait < time.Second {
		t.Fatalf("retry after a failure in %v, want a back-off", wait)
	}
	after, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	if after.ResourceVersion != before.ResourceVersion {
		t.Fatal("a failed issuance changed the Secret")
	}
}

// TestKeeperCompareAndSwap: a write races another writer and loses: the
// Secret keeps the other's, and the keeper looks again at once.
func TestKeeperCompareAndSwap(t *testing.T) {
	k, _, client, _ := newTest(t)
	look(t, k, client)
	ctx := context.Background()
	stale, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	stale = stale.DeepCopy()
	stale.Data[KeyRoots] = nil // due: roots_changed
	client.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(corev1.Resource("secrets"), "istiod-tls", errors.New("changed"))
	})
	if wait := k.keep(ctx, stale); wait != 0 {
		t.Fatalf("after a conflict the keeper waits %v, want to look again at once", wait)
	}
}

func keys(m map[string][]byte) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(out, ",")
}

// TestKeeperRun: Run writes the Secret, follows a change of the CA it is
// told of, and writes it back when someone deletes it.
func TestKeeperRun(t *testing.T) {
	k, tc, client, rootA := newTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor := func(what string, ok func(*Held) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if s, err := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{}); err == nil && ok(Parse(s)) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: not within 10s", what)
	}
	waitFor("first write", func(h *Held) bool { return h.Leaf() != nil })
	rootB := testca.NewRoot(t, "root B", testca.Options{})
	tc.setRoots(rootA.Cert, rootB.Cert)
	k.Changed()
	waitFor("the new bundle", func(h *Held) bool { return len(h.Roots) == 2 })
	if err := client.CoreV1().Secrets("istio-system").Delete(ctx, "istiod-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("written back after a delete", func(h *Held) bool { return h.Leaf() != nil && len(h.Roots) == 2 })
}
