package signers

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/meshca/meshca/signer/k8scsr/k8scsrtest"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

var signerNames atomic.Int64

// newSignerName is a signer name of its own for each test, so that the
// external signers of tests never answer each other's requests.
func newSignerName() string {
	return fmt.Sprintf("meshca.test/k8scsr-%d", signerNames.Add(1))
}

// startExternalSigner runs the external signer for name, as an admin
// (approving needs the approve verb on signers for name, issuing the sign
// verb), answering with answer until the test ends.
func startExternalSigner(tb testing.TB, name string, answer func(*certv1.CertificateSigningRequest) k8scsrtest.Answer) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &k8scsrtest.Controller{Client: cluster.Client, SignerName: name, Answer: answer}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		<-done
		for _, err := range c.Errors() {
			tb.Errorf("external signer: %v", err)
		}
	})
}

// meshcaCSRClient is a client with exactly the RBAC the chart grants
// meshca for the k8scsr signer: create, get, list, watch and delete on
// certificatesigningrequests.
func meshcaCSRClient(tb testing.TB) kubernetes.Interface {
	tb.Helper()
	ctx := context.Background()
	ns := cluster.Namespace(tb, "k8scsr")
	cluster.ServiceAccount(tb, ns, "meshca")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-csr"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
		Verbs: []string{"create", "get", "list", "watch", "delete"},
	}}}
	if _, err := cluster.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-csr"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "meshca"}}}
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = cluster.Client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	return harness.ClientOf(tb, cluster.ServiceAccountKubeconfig(tb, ns, "meshca"))
}

// newK8sCSRSigner is the backend for name, trusting roots.
func newK8sCSRSigner(tb testing.TB, client kubernetes.Interface, name string, roots []*x509.Certificate) *k8scsr.Signer {
	tb.Helper()
	s, err := k8scsr.New(k8scsr.Config{Client: client, SignerName: name, PollInterval: time.Second,
		Roots:         func() []*x509.Certificate { return roots },
		OnDeleteError: func(err error) { tb.Errorf("%v", err) }})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// leftFor lists the CertificateSigningRequests left for signer name.
func leftFor(t *testing.T, name string) []string {
	t.Helper()
	list, err := cluster.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range list.Items {
		names = append(names, o.Name)
	}
	return names
}

// TestK8sCSRContract: the contract suite, the test playing the external
// signer through the real apiserver, meshca with only the RBAC the chart
// grants it.
func TestK8sCSRContract(t *testing.T) {
	client := meshcaCSRClient(t)
	signertest.Run(t, signertest.Backend{
		New: func(tb testing.TB, a *keymgr.Authority) signer.Signer {
			name := newSignerName()
			startExternalSigner(tb, name, k8scsrtest.Issue(a, 0))
			return harness.LintedSigner(tb, a, newK8sCSRSigner(tb, client, name, a.Roots))
		},
		InexactLifetime: true,
	})
}

// TestK8sCSRRefusals: a denial is refused with the signer's message; a
// signer that never answers is unavailable at the deadline; the object is
// deleted either way.
func TestK8sCSRRefusals(t *testing.T) {
	client := meshcaCSRClient(t)
	p := newPKI(t)
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	t.Run("denied", func(t *testing.T) {
		name := newSignerName()
		startExternalSigner(t, name, func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
			return k8scsrtest.Answer{Deny: "namespace a may not have certificates"}
		})
		_, err := newK8sCSRSigner(t, client, name, []*x509.Certificate{p.root.Cert}).Sign(context.Background(), vaultRequest(t, id))
		wantKind(t, err, signer.KindRefused, "namespace a may not have certificates")
		if left := leftFor(t, name); len(left) != 0 {
			t.Fatalf("left behind: %v", left)
		}
	})
	t.Run("never answered", func(t *testing.T) {
		name := newSignerName()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := newK8sCSRSigner(t, client, name, []*x509.Certificate{p.root.Cert}).Sign(ctx, vaultRequest(t, id))
		wantKind(t, err, signer.KindUnavailable, "did not answer")
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("Sign took %v past a 3s deadline", d)
		}
		if left := leftFor(t, name); len(left) != 0 {
			t.Fatalf("left behind: %v", left)
		}
	})
}

// TestMeshcaWithK8sCSR: meshca serve --signer k8scsr issues through the
// cluster's CertificateSigningRequests; the external signer's denial is
// FailedPrecondition, its reason in meshca's log.
func TestMeshcaWithK8sCSR(t *testing.T) {
	p := newPKI(t)
	name := newSignerName()
	var deny atomic.Bool
	issue := k8scsrtest.Issue(p.inter.Authority(), 0)
	startExternalSigner(t, name, func(o *certv1.CertificateSigningRequest) k8scsrtest.Answer {
		if deny.Load() {
			return k8scsrtest.Answer{Deny: "not on the allow list"}
		}
		return issue(o)
	})
	m := harness.StartMeshca(t, bin, "--signer", "k8scsr", "--k8scsr-signer-name", name, "--kubeconfig", cluster.Kubeconfig,
		"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem"))
	if _, err := p.issue(t, m); err != nil {
		t.Fatal(err)
	}
	if _, err := p.issueRSA(t, m); err != nil {
		t.Fatalf("RSA key: %v", err)
	}
	if !m.WaitForLog(5*time.Second, `"backend":"k8scsr"`, `"code":"OK"`) {
		t.Error("audit event does not name the k8scsr backend")
	}
	deny.Store(true)
	if _, err := p.issue(t, m); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("denied: %v, want FailedPrecondition", err)
	}
	if !m.WaitForLog(5*time.Second, `"reason":"signer_refused"`, "not on the allow list") {
		t.Errorf("log lacks the signer's reason:\n%s", m.Logs())
	}
	if left := leftFor(t, name); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
