package e2e

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podCertSurface: PodCertificateRequests for the arena's signer name
// (--pod-certificate-signer-name), made by a client that may create them
// for any Pod (the Node authorizer and NodeRestriction bind a kubelet's
// to its own Pods; a controller, or an administrator's token, is not
// bound). meshca checks every field against the live objects and the
// stub against what a kubelet makes: each lie is Denied with the reason
// the API documents, audited (a pod_certificate event with the request's
// name and the precise reason) and counted in
// meshca_pod_certificate_requests_total{decision="denied",reason}; no
// certificate is written. A request for another signer is left alone.
type podCertSurface struct {
	signer, ns, denyNS string
	flags              []string
	rows               []podCertRow
	foreign            *certv1.PodCertificateRequest
}

type podCertRow struct {
	name, defence string
	req           *certv1.PodCertificateRequest
	// reason is the condition's reason, word the audit and metric reason,
	// msg a fragment of the condition's message.
	reason, word, msg string
}

func newPodCertSurface(t *testing.T) *podCertSurface {
	s := &podCertSurface{signer: fmt.Sprintf("meshca.io/attack-%d", time.Now().UnixNano()%1e9),
		ns: cluster.Namespace(t, "attack-pcr"), denyNS: trustNamespace(t, "attack-pcr-deny", map[string]string{"meshca-attack-deny": "true"})}
	s.flags = []string{"--pod-certificate-signer-name", s.signer, "--pod-certificate-namespace-selector", "meshca-attack-deny!=true"}
	t.Cleanup(func() {
		ctb := strings.ReplaceAll(s.signer, "/", ":") + ":cluster.local"
		_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), ctb, metav1.DeleteOptions{})
	})
	return s
}

// prepare creates the requests at once: meshca answers them while the
// other rows run.
func (s *podCertSurface) prepare(t *testing.T, a *arena) {
	n := time.Now().UnixNano() % 1e9
	node, other := cluster.KubeletNode(t, fmt.Sprintf("attack-pcr-a-%d", n)), cluster.KubeletNode(t, fmt.Sprintf("attack-pcr-b-%d", n))
	web, admin := cluster.ServiceAccount(t, s.ns, "web"), cluster.ServiceAccount(t, s.ns, "admin")
	const bogusUID = "6f1c9b8e-0000-4000-8000-000000000bad"
	i := 0
	// request is a PodCertificateRequest of a new Pod of web on node, as
	// the kubelet would make it, changed by edit.
	request := func(ns string, sa *corev1.ServiceAccount, key crypto.Signer, tmpl *x509.CertificateRequest,
		edit func(*certv1.PodCertificateRequestSpec, *corev1.Pod)) *certv1.PodCertificateRequest {
		i++
		pod := node.Pod(t, ns, fmt.Sprintf("attack-%02d", i), sa, s.signer)
		stub, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		spec := certv1.PodCertificateRequestSpec{SignerName: s.signer, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(node.Node.Name), NodeUID: node.Node.UID,
			StubPKCS10Request: stub}
		if edit != nil {
			edit(&spec, pod)
		}
		return createPCR(t, ns, spec)
	}
	plain := func(edit func(*certv1.PodCertificateRequestSpec, *corev1.Pod)) *certv1.PodCertificateRequest {
		return request(s.ns, web, newP256(t), &x509.CertificateRequest{}, edit)
	}
	stub := func(tmpl *x509.CertificateRequest) *certv1.PodCertificateRequest {
		return request(s.ns, web, newP256(t), tmpl, nil)
	}
	row := func(name, defence, reason, word, msg string, req *certv1.PodCertificateRequest) podCertRow {
		return podCertRow{name: "pod certificate/" + name, defence: "podcert:" + defence, req: req, reason: reason, word: word, msg: msg}
	}
	basic, err := asn1.Marshal(struct{ IsCA bool }{true})
	if err != nil {
		t.Fatal(err)
	}
	challenge := asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}
	const invalid = "InvalidRequest"
	s.rows = []podCertRow{
		row("another Pod UID", "pod_uid", "PodReplaced", "pod_replaced", "not the requesting UID "+bogusUID,
			plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) { sp.PodUID = bogusUID })),
		row("a Pod of another node", "pod_node", "NodeMismatch", "node_mismatch", "not "+other.Node.Name,
			plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) {
				sp.NodeName, sp.NodeUID = types.NodeName(other.Node.Name), other.Node.UID
			})),
		row("another node UID", "node_uid", "NodeMismatch", "node_mismatch", "with UID "+bogusUID+" no longer exists",
			plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) { sp.NodeUID = bogusUID })),
		row("another service account", "pod_service_account", "ServiceAccountMismatch", "service_account_mismatch",
			"runs as service account web, not admin", plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) {
				sp.ServiceAccountName, sp.ServiceAccountUID = admin.Name, admin.UID
			})),
		row("another service account UID", "service_account_uid", "ServiceAccountMismatch", "service_account_mismatch",
			"with UID "+bogusUID+" no longer exists",
			plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) { sp.ServiceAccountUID = bogusUID })),
		row("a Pod that does not exist", "pod_gone", "PodNotFound", "pod_gone", "no longer exists",
			plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) { sp.PodName, sp.PodUID = "ghost-0", bogusUID })),
		row("a Pod that has terminated", "pod_terminated", "PodTerminating", "pod_terminating", "has terminated (Failed)",
			plain(func(_ *certv1.PodCertificateRequestSpec, p *corev1.Pod) { setPhase(t, p, corev1.PodFailed) })),
		row("unverified user annotations", "user_annotations", certv1.PodCertificateRequestConditionInvalidUserConfig, "user_annotations",
			"takes no unverifiedUserAnnotations", plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) {
				sp.UnverifiedUserAnnotations = map[string]string{"example.com/role": "cluster-admin"}
			})),
		row("a namespace the selector leaves out", "namespace_not_allowed", "NamespaceNotAllowed", "namespace_not_allowed",
			"is not selected by meshca's pod certificate namespace selector",
			request(s.denyNS, cluster.ServiceAccount(t, s.denyNS, "web"), newP256(t), &x509.CertificateRequest{}, nil)),
		row("a key outside the policy", "key_policy", certv1.PodCertificateRequestConditionUnsupportedKeyType, "csr_key_policy",
			"ECDSA curve P-521 is not allowed", request(s.ns, web, ecKey(t, elliptic.P521()), &x509.CertificateRequest{}, nil)),
		row("stub with a subject", "stub_subject", invalid, "csr_extra_name", "it has a subject",
			stub(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:masters"}})),
		row("stub asking for a DNS name", "stub_san", invalid, "csr_extension", "it asks for extension 2.5.29.17 (subjectAltName)",
			stub(&x509.CertificateRequest{DNSNames: []string{"kubernetes.default.svc"}})),
		row("stub asking for CA:true", "stub_extension", invalid, "csr_extension", "it asks for extension 2.5.29.19",
			stub(&x509.CertificateRequest{ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: basic}}})),
		row("stub with a challenge password", "stub_attribute", invalid, "csr_extension", "it has attribute 1.2.840.113549.1.9.7",
			stub(&x509.CertificateRequest{Attributes: []pkix.AttributeTypeAndValueSET{{Type: challenge,
				Value: [][]pkix.AttributeTypeAndValue{{{Type: challenge, Value: "hunter2"}}}}}})),
	}
	s.foreign = plain(func(sp *certv1.PodCertificateRequestSpec, _ *corev1.Pod) {
		sp.SignerName = strings.Replace(sp.SignerName, "/", "/other-", 1)
	})
}

// createPCR creates a PodCertificateRequest as the cluster's
// administrator, retrying while the apiserver's admission has not seen
// the Pod yet (as harness.KubeletNode.Request does).
func createPCR(t *testing.T, ns string, spec certv1.PodCertificateRequestSpec) *certv1.PodCertificateRequest {
	t.Helper()
	req := &certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: spec.PodName + "-"}, Spec: spec}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err := cluster.Client.CertificatesV1().PodCertificateRequests(ns).Create(context.Background(), req, metav1.CreateOptions{})
		if err == nil {
			return r
		}
		if !strings.Contains(err.Error(), "while retrieving pod") || time.Now().After(deadline) {
			t.Fatalf("create PodCertificateRequest %s/%s: %v", ns, spec.PodName, err)
		}
	}
}

func (s *podCertSurface) checks(_ *testing.T, a *arena) []check {
	var out []check
	for _, r := range s.rows {
		out = append(out, check{name: r.name, defence: r.defence, run: func(t *testing.T) { s.check(t, a, r) }})
	}
	return append(out, check{name: "pod certificate/another signer's request", defence: "podcert:foreign_signer_ignored",
		run: func(t *testing.T) { s.checkForeign(t, a) }})
}

func (s *podCertSurface) check(t *testing.T, a *arena, r podCertRow) {
	got, cond := cluster.AnsweredPodCertificate(t, r.req, 30*time.Second)
	if cond.Type != certv1.PodCertificateRequestConditionTypeDenied || cond.Reason != r.reason || !strings.Contains(cond.Message, r.msg) {
		t.Errorf("condition %s/%s %q, want Denied/%s containing %q", cond.Type, cond.Reason, cond.Message, r.reason, r.msg)
	}
	if got.Status.CertificateChain != "" {
		t.Error("a certificate chain was written")
	}
	ev := podCertEvent(t, a, r.req)
	for deadline := time.Now().Add(5 * time.Second); ev == nil && time.Now().Before(deadline); ev = podCertEvent(t, a, r.req) {
		time.Sleep(50 * time.Millisecond)
	}
	if ev == nil || ev["decision"] != "denied" || ev["reason"] != r.word {
		t.Errorf("audit event %v, want denied for %s", ev, r.word)
	}
	e := scrapeMetrics(t, a.s.AdminAddr)
	if v, _ := e.value("meshca_pod_certificate_requests_total", map[string]string{"decision": "denied", "reason": r.word}); v < 1 {
		t.Errorf("meshca_pod_certificate_requests_total{decision=denied,reason=%s} = %v, want at least 1", r.word, v)
	}
}

// checkForeign: meshca's signer answers its own signer name only, so a
// request for another is left to that signer: no condition, no event.
func (s *podCertSurface) checkForeign(t *testing.T, a *arena) {
	if wait := time.Until(s.foreign.CreationTimestamp.Add(3 * time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	got, err := cluster.Client.CertificatesV1().PodCertificateRequests(s.ns).Get(context.Background(), s.foreign.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if harness.PodCertificateTerminal(got) != nil || len(got.Status.Conditions) != 0 || got.Status.CertificateChain != "" {
		t.Errorf("the request for %s was answered: %+v", got.Spec.SignerName, got.Status)
	}
	if ev := podCertEvent(t, a, s.foreign); ev != nil {
		t.Errorf("meshca audited the request for %s: %v", got.Spec.SignerName, ev)
	}
}

// podCertEvent is the audit event of r in the arena's log, or nil.
func podCertEvent(t *testing.T, a *arena, r *certv1.PodCertificateRequest) map[string]any {
	t.Helper()
	for _, line := range strings.Split(a.s.Logs(), "\n") {
		var ev map[string]any
		if strings.Contains(line, `"event":"pod_certificate"`) && json.Unmarshal([]byte(line), &ev) == nil &&
			ev["request_id"] == r.Namespace+"/"+r.Name {
			return ev
		}
	}
	return nil
}
