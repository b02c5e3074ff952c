package k8scsr

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// fuzzNow is when meshca created the object in the fuzz target, so that
// its stored inputs, whose certificates are valid then, reproduce.
var fuzzNow = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// fuzzRequest is a P-256 request of the fixed test key for a one-hour
// certificate.
func fuzzRequest(tb testing.TB) *signer.Request {
	return signertest.FixedKeyRequest(tb, spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/frontend"), time.Hour)
}

// conditionsJSON is status.conditions as the apiserver serves them.
func conditionsJSON(tb testing.TB, conds ...certv1.CertificateSigningRequestCondition) []byte {
	tb.Helper()
	for i := range conds {
		conds[i].LastUpdateTime = metav1.NewTime(fuzzNow)
		conds[i].LastTransitionTime = metav1.NewTime(fuzzNow)
	}
	b, err := json.Marshal(conds)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func condition(typ certv1.RequestConditionType, status corev1.ConditionStatus, reason, msg string) certv1.CertificateSigningRequestCondition {
	return certv1.CertificateSigningRequestCondition{Type: typ, Status: status, Reason: reason, Message: msg}
}

// FuzzCSRAnswer feeds the k8scsr signer any status an external signer
// controller may write on a CertificateSigningRequest: status.certificate
// (any bytes) and status.conditions (decoded from JSON as the apiserver
// serves them; none when they do not decode), with or without a trust
// bundle. They are read as Sign reads them: settled decides whether the
// object is answered, then response turns an issued certificate into a
// signer.Response. Nothing may panic, and:
//
//   - the first Denied or Failed condition that is True (or, as in
//     v1beta1, has no status) refuses the request with a KindRefused
//     k8scsr *signer.Error naming the object, the signer, the condition's
//     reason and message (each bounded: valid UTF-8, at most 256 bytes);
//     any other condition (Approved, False, Unknown)
//     neither refuses nor settles; without a refusal the object is
//     settled exactly when status.certificate is not empty;
//   - a status.certificate that pemutil.ParseCertificates refuses is a
//     KindInternal k8scsr *signer.Error;
//   - otherwise response refuses (KindRefused) exactly the leaves that
//     break signer.CheckIssued, which holds them to the requested lifetime
//     and to the chain returned (or, for a leaf alone, the trust bundle's
//     root);
//   - a response's leaf is the first certificate of status.certificate,
//     and its intermediates are the others, in order, without any
//     self-signed root.
func FuzzCSRAnswer(f *testing.F) {
	opts := testca.Options{NotBefore: fuzzNow.Add(-time.Hour), NotAfter: fuzzNow.Add(365 * 24 * time.Hour)}
	root := testca.NewRoot(f, "k8scsr root", opts)
	inter := root.NewIntermediate(f, "external signer", opts)
	short := root.NewIntermediate(f, "short-lived signer", testca.Options{NotBefore: opts.NotBefore, NotAfter: fuzzNow.Add(30 * time.Minute)})
	req := fuzzRequest(f)
	leaf := signertest.WorkloadLeaf(f, inter, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL))
	approved := conditionsJSON(f, condition(certv1.CertificateApproved, corev1.ConditionTrue, "AutoApproved", "approved by the policy"))
	chain := pemutil.EncodeCertificates(leaf, inter.Cert)
	f.Add(chain, approved, true)
	f.Add(pemutil.EncodeCertificates(leaf, inter.Cert, root.Cert), approved, false)
	f.Add(pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, root, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL))), approved, true)
	f.Add(pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, root, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL))), approved, false)
	f.Add(pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, inter, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(2*req.TTL)), inter.Cert), approved, true)
	f.Add(pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, short, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL)), short.Cert), approved, true)
	f.Add(pemutil.EncodeCertificates(inter.Cert, root.Cert), approved, true)
	f.Add(append([]byte("subject=\nissuer=CN = external signer\n"), chain...), approved, true)
	f.Add([]byte(nil), conditionsJSON(f, condition(certv1.CertificateDenied, corev1.ConditionTrue, "TestPolicy", "namespace prod is not allowed")), true)
	f.Add([]byte(nil), conditionsJSON(f, condition(certv1.CertificateFailed, corev1.ConditionTrue, "TestFailure", "HSM offline")), true)
	f.Add(chain, conditionsJSON(f, condition(certv1.CertificateApproved, corev1.ConditionTrue, "AutoApproved", ""),
		condition(certv1.CertificateFailed, "", "Legacy", "v1beta1 left the status empty")), true)
	f.Add(chain, conditionsJSON(f, condition(certv1.CertificateDenied, corev1.ConditionFalse, "Reconsidered", "no longer denied"),
		condition(certv1.CertificateFailed, corev1.ConditionUnknown, "Pending", "")), true)
	f.Add([]byte(nil), approved, true)
	f.Add([]byte("not PEM"), approved, true)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte(`[{"type":"Denied"}]`), true)
	f.Add(chain[:len(chain)-64], []byte(`[{"type":`), true)

	newSigner := func(roots bool) *Signer {
		c := Config{Client: fake.NewClientset(), SignerName: "example.com/meshca"}
		if roots {
			c.Roots = func() []*x509.Certificate { return []*x509.Certificate{root.Cert} }
		}
		s, err := New(c)
		if err != nil {
			f.Fatal(err)
		}
		return s
	}
	signers := map[bool]*Signer{false: newSigner(false), true: newSigner(true)}

	f.Fuzz(func(t *testing.T, certificate, conditions []byte, roots bool) {
		s := signers[roots]
		c := &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "meshca-0123456789abcdef-01234567"}}
		c.Status.Certificate = certificate
		if json.Unmarshal(conditions, &c.Status.Conditions) != nil {
			c.Status.Conditions = nil
		}
		var refusal *certv1.CertificateSigningRequestCondition
		for i, cond := range c.Status.Conditions {
			if (cond.Status == corev1.ConditionTrue || cond.Status == "") && (cond.Type == certv1.CertificateDenied || cond.Type == certv1.CertificateFailed) {
				refusal = &c.Status.Conditions[i]
				break
			}
		}

		done, err := s.settled(c)
		if refusal != nil {
			verb := map[certv1.RequestConditionType]string{certv1.CertificateDenied: "denied", certv1.CertificateFailed: "failed"}[refusal.Type]
			requireKind(t, nil, err, signer.KindRefused)
			for _, want := range []string{c.Name + " " + verb, s.c.SignerName, bounded(refusal.Reason), bounded(refusal.Message)} {
				if !done || !strings.Contains(err.Error(), want) {
					t.Fatalf("settled = %v, %v: want a refusal that names %q", done, err, want)
				}
			}
			if n := len(err.Error()); n > len(c.Name)+len(s.c.SignerName)+2*maxAnswerText+100 || !utf8.ValidString(err.Error()) {
				t.Fatalf("a refusal of %d bytes (valid UTF-8: %v): the signer's reason and message are not bounded", n, utf8.ValidString(err.Error()))
			}
			return
		}
		if err != nil || done != (len(certificate) > 0) {
			t.Fatalf("settled = %v, %v with %d bytes of certificate and no refusal", done, err, len(certificate))
		}
		if !done {
			return
		}

		resp, err := s.response(req, c, fuzzNow)
		parsed, perr := pemutil.ParseCertificates(certificate)
		if perr != nil {
			requireKind(t, resp, err, signer.KindInternal)
			return
		}
		first, rest := parsed[0], parsed[1:]
		limit := certs.EarliestExpiry(rest...)
		if len(rest) == 0 && roots {
			limit = root.Cert.NotAfter
		}
		if signer.CheckIssued(name, req, first, signer.Lifetime{Start: fuzzNow, IssuerNotAfter: limit}) != nil {
			requireKind(t, resp, err, signer.KindRefused)
			return
		}
		if err != nil {
			t.Fatalf("response refused a certificate that keeps the rules: %v", err)
		}
		if !resp.Leaf.Equal(first) {
			t.Fatalf("response returned the leaf %q, not the first certificate %q", resp.Leaf.Subject, first.Subject)
		}
		want := slices.DeleteFunc(slices.Clone(rest), certs.IsSelfSigned)
		if !slices.EqualFunc(resp.Intermediates, want, (*x509.Certificate).Equal) {
			t.Fatalf("response returned %d intermediates, want the %d of the chain that are not roots, in order", len(resp.Intermediates), len(want))
		}
		if resp.VerifiedIssuer != nil {
			t.Fatal("response claims to have verified the leaf's signature")
		}
	})
}

// requireKind fails unless err is a k8scsr *signer.Error of kind want,
// and no response came with it.
func requireKind(t *testing.T, resp *signer.Response, err error, want signer.Kind) {
	t.Helper()
	var se *signer.Error
	if !errors.As(err, &se) || se.Backend != name || se.Kind != want || resp != nil {
		t.Fatalf("response %v, error %v (%T): want a %s k8scsr *signer.Error alone", resp, err, err, want)
	}
}
