// Package k8scsrtest plays the external signer of the k8scsr backend in
// tests: a controller that watches CertificateSigningRequests for one
// signer name and approves and issues, denies, fails or ignores each, as
// a real signer's controller would, through any Kubernetes client (the
// real apiserver, or a fake clientset).
package k8scsrtest

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Answer is what the controller does with a request. The zero value
// ignores it.
type Answer struct {
	// Chain is issued (PEM, leaf first) after approval.
	Chain []byte
	// Deny and Fail, when set, are the message of a Denied (through the
	// approval subresource) or Failed (through status) condition.
	Deny, Fail string
}

// Controller answers CertificateSigningRequests for SignerName.
type Controller struct {
	Client     kubernetes.Interface
	SignerName string
	// Answer decides what to do with a request.
	Answer func(*certv1.CertificateSigningRequest) Answer

	mu   sync.Mutex
	seen map[string]bool
	errs []error
}

// Run answers requests until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	csrs := c.Client.CertificatesV1().CertificateSigningRequests()
	sel := fields.OneTermEqualSelector("spec.signerName", c.SignerName).String()
	for ctx.Err() == nil {
		list, err := csrs.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for i := range list.Items {
			c.handle(ctx, &list.Items[i])
		}
		w, err := csrs.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		c.follow(ctx, w)
		w.Stop()
	}
}

// follow handles the events of w until it ends or ctx does.
func (c *Controller) follow(ctx context.Context, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			if o, isCSR := ev.Object.(*certv1.CertificateSigningRequest); isCSR && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				c.handle(ctx, o)
			}
		}
	}
}

// Errors returns the errors answering requests met so far.
func (c *Controller) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

func (c *Controller) handle(ctx context.Context, o *certv1.CertificateSigningRequest) {
	if o.Spec.SignerName != c.SignerName || len(o.Status.Conditions) > 0 {
		return
	}
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	first := !c.seen[string(o.UID)+o.Name]
	c.seen[string(o.UID)+o.Name] = true
	c.mu.Unlock()
	if !first {
		return
	}
	if err := c.answer(ctx, o.DeepCopy(), c.Answer(o)); err != nil {
		c.mu.Lock()
		c.errs = append(c.errs, fmt.Errorf("%s: %w", o.Name, err))
		c.mu.Unlock()
	}
}

func (c *Controller) answer(ctx context.Context, o *certv1.CertificateSigningRequest, a Answer) error {
	csrs := c.Client.CertificatesV1().CertificateSigningRequests()
	cond := func(t certv1.RequestConditionType, reason, msg string) certv1.CertificateSigningRequestCondition {
		return certv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg,
			LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	}
	var err error
	switch {
	case a.Deny != "":
		o.Status.Conditions = append(o.Status.Conditions, cond(certv1.CertificateDenied, "TestPolicy", a.Deny))
		_, err = csrs.UpdateApproval(ctx, o.Name, o, metav1.UpdateOptions{})
	case a.Fail != "":
		o.Status.Conditions = append(o.Status.Conditions, cond(certv1.CertificateFailed, "TestFailure", a.Fail))
		_, err = csrs.UpdateStatus(ctx, o, metav1.UpdateOptions{})
	case a.Chain != nil:
		o.Status.Conditions = append(o.Status.Conditions, cond(certv1.CertificateApproved, "TestApproved", "approved by k8scsrtest"))
		if o, err = csrs.UpdateApproval(ctx, o.Name, o, metav1.UpdateOptions{}); err != nil {
			return err
		}
		o.Status.Certificate = a.Chain
		_, err = csrs.UpdateStatus(ctx, o, metav1.UpdateOptions{})
	}
	return err
}

// Issue returns an Answer function that signs every request with a, as a
// well-behaved signer does: an empty subject, the CSR's URI SAN alone, the
// usages of spec.usages, a lifetime of spec.expirationSeconds plus extra
// (which may be negative) from now, backdated and never past a's path,
// and the chain leaf first, without the root.
func Issue(a *keymgr.Authority, extra time.Duration) func(*certv1.CertificateSigningRequest) Answer {
	return func(o *certv1.CertificateSigningRequest) Answer {
		req, err := Request(o)
		if err != nil {
			return Answer{Fail: err.Error()}
		}
		leaf, err := issue(a, req, req.TTL+extra)
		if err != nil {
			return Answer{Fail: err.Error()}
		}
		return Answer{Chain: pemutil.EncodeCertificates(append([]*x509.Certificate{leaf}, a.Intermediates()...)...)}
	}
}

func issue(a *keymgr.Authority, req *signer.Request, ttl time.Duration) (*x509.Certificate, error) {
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, err
	}
	skid, err := certs.SubjectKeyID(req.CSR.PublicKey)
	if err != nil {
		return nil, err
	}
	notBefore, notAfter := certs.Window(certs.WindowOptions{Now: time.Now(), TTL: ttl}, a.Cert, a.Chain...)
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: notBefore, NotAfter: notAfter, URIs: []*url.URL{req.ID.URL()},
		KeyUsage: req.Usages.Key, ExtKeyUsage: req.Usages.Ext, BasicConstraintsValid: true, SubjectKeyId: skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, req.CSR.PublicKey, a.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// Request reads the signing request o carries.
func Request(o *certv1.CertificateSigningRequest) (*signer.Request, error) {
	block, _ := pem.Decode(o.Spec.Request)
	if block == nil {
		return nil, errors.New("spec.request holds no PEM")
	}
	parsed, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if len(parsed.URIs) != 1 {
		return nil, fmt.Errorf("CSR names %d URIs, want one", len(parsed.URIs))
	}
	id, err := spiffeid.FromURI(parsed.URIs[0])
	if err != nil {
		return nil, err
	}
	names := make([]string, len(o.Spec.Usages))
	for i, u := range o.Spec.Usages {
		names[i] = string(u)
	}
	usages, err := csr.ParseUsages(names)
	if err != nil {
		return nil, err
	}
	ttl := time.Hour
	if o.Spec.ExpirationSeconds != nil {
		ttl = time.Duration(*o.Spec.ExpirationSeconds) * time.Second
	}
	return &signer.Request{CSR: parsed, ID: id, TTL: ttl, Usages: usages}, nil
}
