package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestPodCertIssued: a good request, created as the node, gets the Pod's
// SVID: leaf first, the times set, the Issued condition; the leaf
// verifies against the ClusterTrustBundle of the signer name and is an
// SVID for go-spiffe; another signer's request gets no answer.
func TestPodCertIssued(t *testing.T) {
	e := newPodCertEnv(t, "issued")
	audit := podCertAuditPath(t, "audit")
	e.start(t, "", audit)
	sa := cluster.ServiceAccount(t, e.ns, "web")
	pod := e.pod(t, "web-1", sa, e.signer)
	key := newP256(t)
	r := e.request(t, pod, sa, e.signer, key, nil)
	got, cond := answered(t, r, 30*time.Second)
	if cond.Type != certv1.PodCertificateRequestConditionTypeIssued || cond.Reason != "Issued" {
		t.Fatalf("condition %+v, want Issued", cond)
	}
	if out, err := yaml.Marshal(got); err == nil {
		t.Logf("the request as meshca answered it:\n%s", out)
	}
	chain, err := pemutil.ParseCertificates([]byte(got.Status.CertificateChain))
	if err != nil || len(chain) == 0 {
		t.Fatalf("certificateChain: %v (%d certificates)", err, len(chain))
	}
	leaf := chain[0]
	st := got.Status
	switch {
	case st.NotBefore == nil || !st.NotBefore.Time.Equal(leaf.NotBefore),
		st.NotAfter == nil || !st.NotAfter.Time.Equal(leaf.NotAfter):
		t.Errorf("notBefore/notAfter %v/%v, leaf %v/%v", st.NotBefore, st.NotAfter, leaf.NotBefore, leaf.NotAfter)
	case st.BeginRefreshAt == nil:
		t.Fatal("no beginRefreshAt")
	case leaf.NotAfter.Sub(leaf.NotBefore) > 24*time.Hour || leaf.NotAfter.Sub(leaf.NotBefore) < time.Hour:
		t.Errorf("lifetime %v outside [1h, 24h] (the default maxExpirationSeconds)", leaf.NotAfter.Sub(leaf.NotBefore))
	}
	if half := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2); st.BeginRefreshAt.Time.Sub(half).Abs() > 75*time.Minute {
		t.Errorf("beginRefreshAt %v, want about half of the lifetime (%v)", st.BeginRefreshAt.Time, half)
	}
	if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Error("leaf not issued to the stub's key")
	}

	// The ClusterTrustBundle of the same signer name holds the roots.
	var ctb *certv1.ClusterTrustBundle
	deadline := time.Now().Add(30 * time.Second)
	for ctb == nil && time.Now().Before(deadline) {
		ctb = clusterTrustBundle(t, cluster.Client, e.ctbName())
		if ctb == nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if ctb == nil || ctb.Spec.SignerName != e.signer {
		t.Fatalf("ClusterTrustBundle %s for signer %s: %+v", e.ctbName(), e.signer, ctb)
	}
	if out, err := yaml.Marshal(ctb); err == nil {
		t.Logf("its ClusterTrustBundle:\n%s", out)
	}
	roots, err := pemutil.ParseCertificates([]byte(ctb.Spec.TrustBundle))
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString(e.td)
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, roots))
	if err != nil {
		t.Fatalf("leaf does not verify against the ClusterTrustBundle: %v", err)
	}
	if want := spiffeid.RequireFromSegments(td, "ns", e.ns, "sa", "web"); id != want {
		t.Errorf("identity %s, want %s", id, want)
	}
	if _, _, err := x509svid.ParseAndVerify([][]byte{leaf.Raw}, x509bundle.FromX509Authorities(td, roots)); err != nil {
		t.Errorf("x509svid.ParseAndVerify: %v", err)
	}

	// Another signer's request is left alone.
	other := strings.Replace(e.signer, "/", "/other-", 1)
	opod := e.pod(t, "web-other", sa, other)
	or := e.request(t, opod, sa, other, newP256(t), nil)
	time.Sleep(3 * time.Second)
	if got, err := cluster.Client.CertificatesV1().PodCertificateRequests(e.ns).Get(context.Background(), or.Name, metav1.GetOptions{}); err != nil || len(got.Status.Conditions) != 0 {
		t.Errorf("request for signer %s answered: %+v, %v", other, got.Status, err)
	}

	events := auditEvents(t, audit)
	if len(events) != 1 || events[0]["decision"] != "issued" || events[0]["serial"] != leaf.SerialNumber.Text(16) ||
		events[0]["identity"] != id.String() || events[0]["request_id"] != e.ns+"/"+r.Name {
		t.Errorf("audit events %v, want one issued for serial %s", events, leaf.SerialNumber.Text(16))
	}
}

// TestPodCertRefused: each refusal is a terminal condition with the
// reason the API documents, audited.
func TestPodCertRefused(t *testing.T) {
	e := newPodCertEnv(t, "refused")
	audit := podCertAuditPath(t, "audit")
	sa := cluster.ServiceAccount(t, e.ns, "api")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		setup      func(t testing.TB) *certv1.PodCertificateRequest
		cond, why  string
		msg        string
		auditWords string
	}{
		{name: "key outside the policy", setup: func(t testing.TB) *certv1.PodCertificateRequest {
			return e.request(t, e.pod(t, "api-key", sa, e.signer), sa, e.signer, p384, nil)
		}, cond: "Denied", why: "UnsupportedKeyType", msg: "ECDSA curve P-384 is not allowed (allowed: ECDSA P-256, Ed25519)", auditWords: "csr_key_policy"},
		{name: "pod deleted", setup: func(t testing.TB) *certv1.PodCertificateRequest {
			p := e.pod(t, "api-gone", sa, e.signer)
			r := e.request(t, p, sa, e.signer, newP256(t), nil)
			cluster.DeletePod(t, e.ns, p.Name)
			return r
		}, cond: "Denied", why: "PodNotFound", msg: "no longer exists", auditWords: "pod_gone"},
		{name: "pod replaced", setup: func(t testing.TB) *certv1.PodCertificateRequest {
			p := e.pod(t, "api-replaced", sa, e.signer)
			r := e.request(t, p, sa, e.signer, newP256(t), nil)
			cluster.DeletePod(t, e.ns, p.Name)
			e.pod(t, "api-replaced", sa, e.signer)
			return r
		}, cond: "Denied", why: "PodReplaced", msg: "not the requesting UID", auditWords: "pod_replaced"},
		{name: "stub asking for a name", setup: func(t testing.TB) *certv1.PodCertificateRequest {
			return e.node.RequestWithStub(t, e.pod(t, "api-names", sa, e.signer), sa, e.signer,
				&x509.CertificateRequest{DNSNames: []string{"api." + e.ns + ".svc"}}, newP256(t), nil)
		}, cond: "Denied", why: "InvalidRequest", msg: "the stub CSR is refused: it asks for extension 2.5.29.17 (subjectAltName): a kubelet's stub carries the Pod's key alone",
			auditWords: "csr_extension"},
	}
	// Every request is made, and its Pod changed, before meshca starts.
	reqs := make([]*certv1.PodCertificateRequest, len(tests))
	for i, tt := range tests {
		reqs[i] = tt.setup(t)
	}
	e.start(t, "", audit, "--key-policy", "ecdsa-p256,ed25519")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cond := answered(t, reqs[i], 30*time.Second)
			if cond.Type != tt.cond || cond.Reason != tt.why || !strings.Contains(cond.Message, tt.msg) {
				t.Errorf("condition %s/%s %q, want %s/%s containing %q", cond.Type, cond.Reason, cond.Message, tt.cond, tt.why, tt.msg)
			}
		})
	}
	words := map[string]bool{}
	for _, ev := range auditEvents(t, audit) {
		words[ev["reason"].(string)] = ev["decision"] == "denied"
	}
	for _, tt := range tests {
		if !words[tt.auditWords] {
			t.Errorf("no denied audit event with reason %s: %v", tt.auditWords, words)
		}
	}
}

// TestPodCertMaxExpiration: the lifetime never exceeds
// maxExpirationSeconds and is never under an hour; below meshca's
// --max-ttl it is exactly maxExpirationSeconds.
func TestPodCertMaxExpiration(t *testing.T) {
	e := newPodCertEnv(t, "maxexp")
	e.start(t, "", podCertAuditPath(t, "audit"))
	sa := cluster.ServiceAccount(t, e.ns, "batch")
	tests := []int32{3600, 5400, 7 * 86400}
	for i, secs := range tests {
		pod := e.pod(t, "b"+string(rune('a'+i)), sa, e.signer)
		r := e.request(t, pod, sa, e.signer, newP256(t), &secs)
		got, cond := answered(t, r, 30*time.Second)
		if cond.Type != "Issued" {
			t.Errorf("maxExpirationSeconds %d: %+v", secs, cond)
			continue
		}
		life := got.Status.NotAfter.Sub(got.Status.NotBefore.Time)
		if life > time.Duration(secs)*time.Second || life < time.Hour {
			t.Errorf("maxExpirationSeconds %d: lifetime %v", secs, life)
		}
		// Under meshca's --max-ttl (24h), the lifetime is the one allowed,
		// to the second, whatever the backdate.
		if max := time.Duration(secs) * time.Second; max <= 24*time.Hour && life != max {
			t.Errorf("maxExpirationSeconds %d: lifetime %v, want exactly %v", secs, life, max)
		}
	}
}

// TestPodCertNodeBudget: a kubelet's requests spend its node's turn of
// the node proxy budget. With bursts of 2 and a rate that does not refill
// within the test, two of a node's three requests are issued and the
// third is left unanswered (queued again, counted as rate limited), while
// another node's request is issued from a budget of its own.
func TestPodCertNodeBudget(t *testing.T) {
	e := newPodCertEnv(t, "budget")
	s := e.start(t, "", podCertAuditPath(t, "audit"), "--node-proxy-rate", "0.001", "--node-proxy-burst", "2")
	sa := cluster.ServiceAccount(t, e.ns, "web")
	var reqs []*certv1.PodCertificateRequest
	for i := range 3 {
		reqs = append(reqs, e.request(t, e.pod(t, fmt.Sprintf("web-%d", i), sa, e.signer), sa, e.signer, newP256(t), nil))
	}
	other := cluster.KubeletNode(t, e.node.Node.Name+"-other")
	elsewhere := other.Request(t, other.Pod(t, e.ns, "web-elsewhere", sa, e.signer), sa, e.signer, newP256(t), nil)
	if _, cond := answered(t, elsewhere, 30*time.Second); cond.Type != "Issued" {
		t.Errorf("the other node's request: %+v, want Issued from a budget of its own", cond)
	}

	// Two are issued; the third waits for a token that does not come in
	// the test's time: unanswered, and counted each time it is refused.
	var issued, open int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		issued, open = 0, 0
		for _, r := range reqs {
			got, err := cluster.Client.CertificatesV1().PodCertificateRequests(e.ns).Get(context.Background(), r.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			switch c := got.Status.Conditions; {
			case len(c) == 0 && got.Status.CertificateChain == "":
				open++
			case len(c) == 1 && c[0].Type == "Issued":
				issued++
			default:
				t.Fatalf("request %s: status %+v, want Issued or none", r.Name, got.Status)
			}
		}
		limited := sampleValue(scrapeMetrics(t, s.AdminAddr), "meshca_rate_limited_total", "reason", "node_proxy_rate")
		if issued == 2 && open == 1 && limited >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the node's 3 requests issued, %d unanswered, %v counted rate limited; want 2, 1 and at least 1", issued, open, limited)
		}
	}
}
