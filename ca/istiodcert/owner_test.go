package istiodcert

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// observed records what an Observer hears.
type observed struct {
	mu      sync.Mutex
	refused []string
	written []string
}

func (o *observed) Written(reason string, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.written = append(o.written, reason)
}
func (o *observed) Failed(string) {}
func (o *observed) Restarted()    {}
func (o *observed) Refused(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused = append(o.refused, reason)
}

func (o *observed) last() (refused, written string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.refused) > 0 {
		refused = o.refused[len(o.refused)-1]
	}
	if len(o.written) > 0 {
		written = o.written[len(o.written)-1]
	}
	return refused, written
}

// certManagerSecret is istiod-tls as cert-manager writes it for a
// Certificate (istio-csr's install): its annotations and label, a
// kubernetes.io/tls Secret of its own certificate.
func certManagerSecret(t *testing.T) *corev1.Secret {
	other := testca.NewRoot(t, "istio-csr's", testca.Options{})
	key, _ := pemutil.EncodePrivateKey(other.Key)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istiod-tls",
			Labels: map[string]string{"controller.cert-manager.io/fao": "true"},
			Annotations: map[string]string{
				"cert-manager.io/alt-names": "istiod.istio-system.svc", "cert-manager.io/certificate-name": "istiod",
				"cert-manager.io/common-name": "", "cert-manager.io/ip-sans": "", "cert-manager.io/uri-sans": "",
				"cert-manager.io/issuer-group": "cert-manager.io", "cert-manager.io/issuer-kind": "Issuer", "cert-manager.io/issuer-name": "istio-ca",
			}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{KeyCert: pemutil.EncodeCertificates(other.Cert), KeyKey: key, KeyRoots: pemutil.EncodeCertificates(other.Cert)},
	}
}

// TestKeeperRefusesOthersSecrets: a Secret of another owner, or none, is
// never written, whatever it holds; the refusal names the owner, reaches
// the observer (the metric) and Refusal (readiness), and ends when the
// Secret is meshca's again.
func TestKeeperRefusesOthersSecrets(t *testing.T) {
	secret := func(mutate func(*corev1.Secret)) func(*testing.T) *corev1.Secret {
		return func(t *testing.T) *corev1.Secret {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istiod-tls"}, Type: corev1.SecretTypeOpaque,
				Data: map[string][]byte{"config": []byte("someone's")}}
			mutate(s)
			return s
		}
	}
	tests := []struct {
		name   string
		secret func(*testing.T) *corev1.Secret
		reason string
		msg    []string
	}{
		{"cert-manager's Certificate", certManagerSecret, RefusedCertManager,
			[]string{`Secret istio-system/istiod-tls belongs to cert-manager (Certificate "istiod", Issuer "istio-ca"): not written`,
				"delete its Certificate (or cert-manager writes it back), then annotate it meshca.io/adopt=true", "meshca.io/owner=" + testOwner}},
		{"cert-manager's marked as meshca's: contested", func(t *testing.T) *corev1.Secret {
			s := certManagerSecret(t)
			s.Annotations[AnnotationOwner] = testOwner
			return s
		}, RefusedCertManager, []string{`belongs to cert-manager (Certificate "istiod", Issuer "istio-ca")`}},
		{"the CA state (--state-secret)", secret(func(s *corev1.Secret) {
			s.Labels = map[string]string{LabelManagedBy: ManagedBy}
			s.Data = map[string][]byte{"state.json": []byte("{}"), "key-0123456789abcdef.pem": []byte("key")}
		}), RefusedCAKey, []string{`Secret istio-system/istiod-tls is not istiod's certificate: it holds a CA's private key (entry "key-0123456789abcdef.pem")`,
			"never writes it, adopted or not"}},
		{"Istio's cacerts, even handed over", secret(func(s *corev1.Secret) {
			s.Annotations = map[string]string{AnnotationAdopt: "true"}
			s.Data = map[string][]byte{"ca-cert.pem": nil, "ca-key.pem": []byte("key"), "root-cert.pem": nil, "cert-chain.pem": nil}
		}), RefusedCAKey, []string{`it holds a CA's private key (entry "ca-key.pem")`}},
		{"an owner reference", secret(func(s *corev1.Secret) {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "istio", UID: "u"}}
		}), RefusedOwnerReference, []string{`belongs to "ConfigMap" "istio" (its ownerReferences)`}},
		{"another meshca", secret(func(s *corev1.Secret) { s.Annotations = map[string]string{AnnotationOwner: "other/meshca-istiod-cert"} }),
			RefusedOtherMeshca, []string{`belongs to another meshca (meshca.io/owner="other/meshca-istiod-cert")`}},
		{"another manager", secret(func(s *corev1.Secret) { s.Labels = map[string]string{LabelManagedBy: "Helm"} }),
			RefusedManagedBy, []string{`belongs to "Helm" (label app.kubernetes.io/managed-by)`}},
		{"no mark", secret(func(*corev1.Secret) {}), RefusedUnmarked, []string{"belongs to no owner meshca knows of (no meshca mark)"}},
		{"a long owner is cut short", secret(func(s *corev1.Secret) { s.Labels = map[string]string{LabelManagedBy: strings.Repeat("x", 63)} }),
			RefusedManagedBy, []string{`"` + strings.Repeat("x", 63) + `"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, tc, client, _ := newTest(t)
			obs := &observed{}
			k.c.Observe = obs
			ctx := context.Background()
			before, err := client.CoreV1().Secrets("istio-system").Create(ctx, tt.secret(t), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if wait := k.keep(ctx, before); wait != k.c.Resync {
				t.Errorf("after a refusal the keeper looks again in %v, want the resync period", wait)
			}
			after, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
			if !apiequality.Semantic.DeepEqual(before, after) || tc.issued.Load() != 0 {
				t.Fatalf("the Secret was written (issued %d):\nbefore %+v\nafter  %+v", tc.issued.Load(), before, after)
			}
			var refused *RefusedError
			if err := k.Refusal(); !errors.As(err, &refused) || refused.Reason != tt.reason {
				t.Fatalf("Refusal() = %v, want reason %s", err, tt.reason)
			}
			for _, m := range tt.msg {
				if !strings.Contains(k.Refusal().Error(), m) {
					t.Errorf("refusal %q\ndoes not say %q", k.Refusal(), m)
				}
			}
			if r, _ := obs.last(); r != tt.reason {
				t.Errorf("observer heard %q, want %q", r, tt.reason)
			}
			// Gone: the keeper creates its own, and the refusal ends.
			if err := client.CoreV1().Secrets("istio-system").Delete(ctx, "istiod-tls", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if h := look(t, k, client); h.Leaf() == nil || k.Refusal() != nil {
				t.Fatalf("after the delete: leaf %v, refusal %v", h.Leaf() != nil, k.Refusal())
			}
			if r, w := obs.last(); r != "" || w != ReasonMissing {
				t.Errorf("observer heard refused %q, written %q; want none and %s", r, w, ReasonMissing)
			}
		})
	}
}

// TestKeeperWritesItsOwn: the Secrets the keeper may write, and the mark
// each carries after its write.
func TestKeeperWritesItsOwn(t *testing.T) {
	tests := []struct {
		name      string
		secret    *corev1.Secret // nil: none
		reason    string
		managedBy string
	}{
		{name: "none: created", reason: ReasonMissing, managedBy: ManagedBy},
		{name: "the chart's, empty", secret: &corev1.Secret{Type: corev1.SecretTypeOpaque, ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{LabelManagedBy: "Helm"}, Annotations: map[string]string{AnnotationOwner: testOwner, "helm.sh/resource-policy": "keep"}}},
			reason: ReasonMissing, managedBy: "Helm"},
		{name: "an older chart's, empty", secret: &corev1.Secret{Type: corev1.SecretTypeOpaque, ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app.kubernetes.io/part-of": "meshca", "helm.sh/chart": "meshca-0.1.0"}}},
			reason: ReasonMissing, managedBy: ManagedBy},
		{name: "an older meshca's", secret: &corev1.Secret{Type: corev1.SecretTypeTLS, ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{LabelManagedBy: ManagedBy}}, Data: map[string][]byte{KeyCert: nil, KeyKey: nil, KeyRoots: nil}},
			reason: ReasonMissing, managedBy: ManagedBy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, _, client, _ := newTest(t)
			ctx := context.Background()
			if tt.secret != nil {
				tt.secret.Namespace, tt.secret.Name = "istio-system", "istiod-tls"
				if _, err := client.CoreV1().Secrets("istio-system").Create(ctx, tt.secret, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			obs := &observed{}
			k.c.Observe = obs
			h := look(t, k, client)
			s, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
			if _, w := obs.last(); h.Leaf() == nil || w != tt.reason {
				t.Fatalf("written for %q, want %q", w, tt.reason)
			}
			if s.Annotations[AnnotationOwner] != testOwner || s.Labels[LabelManagedBy] != tt.managedBy {
				t.Errorf("marks %v %v, want %s=%s and %s=%s", s.Labels, s.Annotations, AnnotationOwner, testOwner, LabelManagedBy, tt.managedBy)
			}
		})
	}
	// Written before the owner mark, with a certificate that serves: the
	// keeper marks it at once, for no other reason.
	k, _, client, _ := newTest(t)
	look(t, k, client)
	ctx := context.Background()
	s, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	delete(s.Annotations, AnnotationOwner)
	if _, err := client.CoreV1().Secrets("istio-system").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	k.c.Observe = obs
	look(t, k, client)
	s, _ = client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	if _, w := obs.last(); w != ReasonOwnerMark || s.Annotations[AnnotationOwner] != testOwner {
		t.Errorf("an unmarked Secret of meshca's: written for %q, mark %q; want %s and %s", w, s.Annotations[AnnotationOwner], ReasonOwnerMark, testOwner)
	}
}

// TestKeeperAdopts: adopting cert-manager's Secret is an operator's
// explicit choice, AnnotationAdopt; the keeper then writes its own
// certificate and mark and drops cert-manager's marks and the request.
// When cert-manager writes its marks back (its Certificate still
// exists), the Secret is contested: refused again, not fought over.
func TestKeeperAdopts(t *testing.T) {
	k, _, client, _ := newTest(t)
	obs := &observed{}
	k.c.Observe = obs
	ctx := context.Background()
	cm := certManagerSecret(t)
	cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "cert-manager.io/v1", Kind: "Certificate", Name: "istiod", UID: "u"}}
	cm.Labels["team"] = "mesh"
	if _, err := client.CoreV1().Secrets("istio-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if h := look(t, k, client); k.Refusal() == nil || h.Leaf().Subject.CommonName != "istio-csr's" {
		t.Fatal("cert-manager's Secret was taken over without being handed over")
	}
	s, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	s.Annotations[AnnotationAdopt] = "true"
	if _, err := client.CoreV1().Secrets("istio-system").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := look(t, k, client)
	s, _ = client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	if r, w := obs.last(); r != "" || w != ReasonAdopted || decide(h, k.now()) != "" || k.Refusal() != nil {
		t.Fatalf("adoption: refused %q, written %q, refusal %v", r, w, k.Refusal())
	}
	for key := range s.Annotations {
		if strings.HasPrefix(key, "cert-manager.io/") || key == AnnotationAdopt {
			t.Errorf("annotation %s kept after the adoption", key)
		}
	}
	if s.Annotations[AnnotationOwner] != testOwner || s.Labels[LabelManagedBy] != ManagedBy || s.Labels["team"] != "mesh" ||
		s.Labels["controller.cert-manager.io/fao"] != "" || len(s.OwnerReferences) != 0 {
		t.Errorf("after the adoption: labels %v, annotations %v, owners %v", s.Labels, s.Annotations, s.OwnerReferences)
	}

	// cert-manager writes its certificate and marks back.
	back := certManagerSecret(t)
	back.ResourceVersion = s.ResourceVersion
	back.Annotations[AnnotationOwner] = testOwner
	if _, err := client.CoreV1().Secrets("istio-system").Update(ctx, back, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	look(t, k, client)
	after, _ := client.CoreV1().Secrets("istio-system").Get(ctx, "istiod-tls", metav1.GetOptions{})
	if r, _ := obs.last(); r != RefusedCertManager || !apiequality.Semantic.DeepEqual(before, after) {
		t.Errorf("contested Secret: refused %q, written again %v", r, !apiequality.Semantic.DeepEqual(before, after))
	}
}
