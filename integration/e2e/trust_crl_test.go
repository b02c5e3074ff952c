package e2e

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/crlverify"
	"github.com/meshca/meshca/internal/testca"
)

// crlSet is a CRL bundle the test makes: a CRL of the root and one of
// the intermediate, each listing the serials given, PEM, concatenated.
type crlSet struct {
	root, inter *testca.CA
	this, next  time.Time
}

func (s crlSet) bundle(t *testing.T, rootRevokes, interRevokes []*big.Int) []byte {
	t.Helper()
	var out []byte
	for _, c := range []struct {
		ca      *testca.CA
		serials []*big.Int
	}{{s.root, rootRevokes}, {s.inter, interRevokes}} {
		tmpl := &x509.RevocationList{Number: big.NewInt(time.Now().UnixNano()), ThisUpdate: s.this, NextUpdate: s.next}
		for _, serial := range c.serials {
			tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
				x509.RevocationListEntry{SerialNumber: serial, RevocationTime: s.this, ReasonCode: 1})
		}
		der, err := x509.CreateRevocationList(rand.Reader, tmpl, c.ca.Cert, c.ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})...)
	}
	return out
}

func crlConfigMap(t *testing.T, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// waitCRL waits up to 5 s until every namespace's istio-ca-crl holds pem
// alone, and returns how long that took.
func waitCRL(t *testing.T, what string, pem []byte, nss ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for _, ns := range nss {
		for {
			cm := crlConfigMap(t, ns, trust.CRLConfigMapName)
			if cm != nil && len(cm.Data) == 1 && cm.Data[trust.CRLDataKey] == string(pem) && cm.Labels[trust.LabelKey] == trust.LabelValue {
				break
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: %s does not hold the CRLs within 5s: %+v", what, ns, cm)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// judge reads ns's published ca-crl.pem and checks chain by the strict
// rules, by ztunnel's and by openssl: nil from all three, or the strict
// reason all three refused for (ztunnel's must be the same reason).
func judge(t *testing.T, ns string, roots, chain []*x509.Certificate) string {
	t.Helper()
	file := []byte(crlConfigMap(t, ns, trust.CRLConfigMapName).Data[trust.CRLDataKey])
	crls, err := crlverify.Parse(file)
	if err != nil {
		t.Fatalf("%s: the published ca-crl.pem: %v", ns, err)
	}
	now := time.Now()
	reason := func(p crlverify.Policy) string {
		err := crlverify.Verifier{Roots: roots, CRLs: crls, Policy: p}.Verify(chain, now)
		var e *crlverify.Error
		if errors.As(err, &e) {
			return e.Reason
		}
		if err != nil {
			t.Fatal(err)
		}
		return ""
	}
	strict, zt := reason(crlverify.Strict), reason(crlverify.Ztunnel)
	osslErr := crlverify.OpenSSL(context.Background(), t.TempDir(), roots, chain, file, now)
	if strict != zt || (strict == "") != (osslErr == nil) {
		t.Fatalf("%s: verifiers disagree: strict %q, ztunnel %q, openssl %v", ns, strict, zt, osslErr)
	}
	return strict
}

// TestCRLPublishedRepairedOwned: against the real apiserver, a Publisher
// of istio-ca-crl puts the CRLs in every selected namespace within one
// round, and a new CRL too; the published file refuses the revoked leaf
// and then the revoked intermediate, by both verifiers, and passes what
// is not revoked; a tenant's edit or deletion is repaired; ConfigMaps of
// another name, and istio-ca-crl outside the selection, are untouched.
func TestCRLPublishedRepairedOwned(t *testing.T) {
	ctx := context.Background()
	lbls, sel := runLabel(t)
	nss := []string{trustNamespace(t, "crl-a", lbls), trustNamespace(t, "crl-b", lbls), trustNamespace(t, "crl-c", lbls)}
	outside := trustNamespace(t, "crl-outside", nil)
	theirs := []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: trust.CRLConfigMapName, Namespace: outside},
			Data: map[string]string{trust.CRLDataKey: "another owner's CRL"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "tenant-crl", Namespace: nss[0]},
			Data: map[string]string{trust.CRLDataKey: "a tenant's own"}},
		{ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: nss[1]},
			Data: map[string]string{trust.DataKey: "roots someone else publishes"}},
	}
	for i, cm := range theirs {
		created, err := cluster.Client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		theirs[i] = created
	}

	root := testca.NewRoot(t, "meshca crl root", testca.Options{})
	inter := root.NewIntermediate(t, "meshca crl intermediate", testca.Options{})
	revoked := inter.Leaf(t, "spiffe://cluster.local/ns/a/sa/stolen", nil)
	kept := inter.Leaf(t, "spiffe://cluster.local/ns/a/sa/web", nil)
	roots := []*x509.Certificate{root.Cert}
	set := crlSet{root: root, inter: inter, this: time.Now().Add(-5 * time.Minute), next: time.Now().Add(time.Hour)}
	first := set.bundle(t, nil, []*big.Int{revoked.SerialNumber})
	var current atomic.Pointer[[]byte]
	current.Store(&first)
	p := startPublisher(t, trust.Config{Document: trust.CRLDocument, Selector: sel,
		Bundle: func() trust.Bundle { return trust.Bundle{PEM: *current.Load()} }})
	took := waitCRL(t, "existing namespaces", first, nss...)
	harness.Report(t, "istio-ca-crl published to %d namespaces in %v", len(nss), took)

	for _, ns := range nss {
		if r := judge(t, ns, roots, []*x509.Certificate{revoked, inter.Cert}); r != crlverify.ReasonRevoked {
			t.Errorf("%s: the revoked leaf: %q, want revoked", ns, r)
		}
		if r := judge(t, ns, roots, []*x509.Certificate{kept, inter.Cert}); r != "" {
			t.Errorf("%s: a leaf not revoked: refused, %s", ns, r)
		}
	}

	// The intermediate revoked: a new CRL of the root, everywhere.
	set.next = time.Now().Add(2 * time.Hour)
	second := set.bundle(t, []*big.Int{inter.Cert.SerialNumber}, []*big.Int{revoked.SerialNumber})
	current.Store(&second)
	p.BundleChanged()
	took = waitCRL(t, "a new CRL", second, nss...)
	harness.Report(t, "a new CRL published to %d namespaces in %v", len(nss), took)
	if r := judge(t, nss[2], roots, []*x509.Certificate{kept, inter.Cert}); r != crlverify.ReasonRevoked {
		t.Errorf("a leaf under the revoked intermediate: %q, want revoked", r)
	}

	// A tenant empties its namespace's list: written back; deletes it:
	// created again.
	cm := crlConfigMap(t, nss[0], trust.CRLConfigMapName)
	cm.Data[trust.CRLDataKey] = ""
	if _, err := cluster.Client.CoreV1().ConfigMaps(nss[0]).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took = waitCRL(t, "a tenant's edit", second, nss[0])
	harness.Report(t, "a tenant's edit of istio-ca-crl overwritten in %v", took)
	if err := cluster.Client.CoreV1().ConfigMaps(nss[1]).Delete(ctx, trust.CRLConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRL(t, "a tenant's deletion", second, nss[1])

	time.Sleep(500 * time.Millisecond) // the queue is drained by now; look for stray writes
	for _, want := range theirs {
		got := crlConfigMap(t, want.Namespace, want.Name)
		if got == nil || got.ResourceVersion != want.ResourceVersion {
			t.Errorf("%s/%s was written: %+v", want.Namespace, want.Name, got)
		}
	}
}

// TestClusterTrustBundleRefusesCRL: the real apiserver admits
// certificates alone in a ClusterTrustBundle, so the CRLs cannot travel
// with the roots there (docs/revocation.md, "Pod certificates").
func TestClusterTrustBundleRefusesCRL(t *testing.T) {
	root := testca.NewRoot(t, "meshca ctb root", testca.Options{})
	set := crlSet{root: root, inter: root.NewIntermediate(t, "meshca ctb intermediate", testca.Options{}),
		this: time.Now().Add(-time.Minute), next: time.Now().Add(time.Hour)}
	bundle := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})) + string(set.bundle(t, nil, nil))
	_, err := cluster.Client.CertificatesV1().ClusterTrustBundles().Create(context.Background(), &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-crl-probe"}, Spec: certv1.ClusterTrustBundleSpec{TrustBundle: bundle},
	}, metav1.CreateOptions{})
	if err == nil {
		_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), "meshca-crl-probe", metav1.DeleteOptions{})
		t.Fatal("the apiserver took a ClusterTrustBundle holding CRLs")
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("err %v, want Invalid", err)
	}
	harness.Report(t, "a ClusterTrustBundle with a CRL refused: %v", err)
}
