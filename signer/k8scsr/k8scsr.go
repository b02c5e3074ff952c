// Package k8scsr signs workload certificates through the Kubernetes
// CertificateSigningRequest API (certificates.k8s.io/v1): meshca creates a
// CertificateSigningRequest for a configured signer name, waits within the
// request's deadline for whatever signs that name in the cluster (a
// controller of the operator's choosing) to approve and issue it, holds
// the answer to meshca's rules (signer.CheckIssued, the requested
// lifetime among them) and deletes the object.
//
// The trust bundle is never learned from the cluster: meshca pins it
// (--trust-anchors) or follows a CA state, as for the other external
// backends.
package k8scsr

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const name = "k8scsr"

// MinTTL is the shortest lifetime the CertificateSigningRequest API takes
// (spec.expirationSeconds); a request for less is refused before any
// object is created.
const MinTTL = 600 * time.Second

// Labels and annotations meshca puts on the objects it creates.
const (
	LabelManagedBy      = "app.kubernetes.io/managed-by"
	ManagedBy           = "meshca"
	AnnotationSPIFFEID  = "meshca.io/spiffe-id"
	namePrefix          = "meshca-"
	defaultPoll         = 5 * time.Second
	defaultDeleteBudget = 5 * time.Second
)

// Config of the CertificateSigningRequest backend.
type Config struct {
	// Client talks to the cluster; meshca needs create, get, list, watch
	// and delete on certificatesigningrequests.
	Client kubernetes.Interface
	// SignerName is spec.signerName of the requests, e.g.
	// example.com/meshca. The built-in kubernetes.io signers are refused:
	// they copy the CSR's subject and restrict usages, so nothing they
	// issue is a valid SVID.
	SignerName string
	// Roots returns the trust bundle. When the signer returns the leaf
	// alone, the leaf may not outlive the root that signed it (or the
	// earliest root when none did). Nil sets no such limit.
	Roots func() []*x509.Certificate
	// PollInterval is how often the object is read while meshca waits, as
	// a fallback for a watch that cannot be started or stalls; zero means
	// 5 s.
	PollInterval time.Duration
	// DeleteTimeout bounds the deletion of the object after a request,
	// which runs even when the request's context has ended; zero means 5 s.
	DeleteTimeout time.Duration
	// OnDeleteError reports an object that could not be deleted (logged by
	// the caller); nil ignores it.
	OnDeleteError func(error)
	// Now is the clock the lifetime is measured on; nil means time.Now.
	Now func() time.Time
}

// Signer is the CertificateSigningRequest backend.
type Signer struct {
	c Config
}

var _ signer.Signer = (*Signer)(nil)

// New returns a signer; it does no I/O.
func New(c Config) (*Signer, error) {
	domain, path, _ := strings.Cut(c.SignerName, "/")
	switch {
	case c.Client == nil:
		return nil, errors.New("k8scsr: a Kubernetes client is required")
	case c.SignerName == "":
		return nil, errors.New("k8scsr: a signer name is required")
	case domain == "" || path == "" || !strings.Contains(domain, "."):
		return nil, fmt.Errorf("k8scsr: signer name %q is not of the form example.com/name", c.SignerName)
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return nil, fmt.Errorf("k8scsr: signer name %q is a built-in Kubernetes signer, which cannot issue SPIFFE certificates: name the signer of your own controller", c.SignerName)
	}
	if c.PollInterval <= 0 {
		c.PollInterval = defaultPoll
	}
	if c.DeleteTimeout <= 0 {
		c.DeleteTimeout = defaultDeleteBudget
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Signer{c: c}, nil
}

// Sign implements signer.Signer: it creates a CertificateSigningRequest,
// waits for the external signer's answer until ctx ends and deletes the
// object, whatever the outcome.
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	obj, err := s.object(req)
	if err != nil {
		return nil, err
	}
	start := s.c.Now()
	created, err := s.c.Client.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		if mayBeStored(err) {
			// The name is meshca's own (random suffix): a Create whose
			// answer was lost may have stored it all the same.
			s.delete(ctx, obj)
		}
		return nil, classify("create CertificateSigningRequest", err)
	}
	defer s.delete(ctx, created)
	answered, err := s.wait(ctx, created)
	if err != nil {
		return nil, err
	}
	return s.response(req, answered, start)
}

// object is the CertificateSigningRequest for req.
func (s *Signer) object(req *signer.Request) (*certv1.CertificateSigningRequest, error) {
	if req.DNS() {
		// The signer of a CertificateSigningRequest decides what it
		// certifies; meshca names the SPIFFE ID in an annotation, and has
		// no equal for istiod's DNS names that a signer could be told to
		// honour apart from a workload's.
		return nil, signer.Errorf(name, signer.KindRefused,
			"CertificateSigningRequests do not issue DNS certificates (istiod's): sign them with the local, cfssl or vault signer")
	}
	if req.TTL < MinTTL {
		return nil, signer.Errorf(name, signer.KindRefused,
			"requested lifetime %v is under %v, the least a CertificateSigningRequest takes (spec.expirationSeconds)", req.TTL, MinTTL)
	}
	usages, err := Usages(req.Usages)
	if err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: err}
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	sum := sha256.Sum256(req.CSR.Raw)
	seconds := int32(min(math.Ceil(req.TTL.Seconds()), math.MaxInt32))
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name:        namePrefix + hex.EncodeToString(sum[:8]) + "-" + hex.EncodeToString(suffix),
			Labels:      map[string]string{LabelManagedBy: ManagedBy},
			Annotations: map[string]string{AnnotationSPIFFEID: req.ID.String()},
		},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw}),
			SignerName:        s.c.SignerName,
			ExpirationSeconds: &seconds,
			Usages:            usages,
		},
	}, nil
}

// apiUsages are the usages a workload certificate may carry, in the API's
// vocabulary.
var apiUsages = []struct {
	key x509.KeyUsage
	ext x509.ExtKeyUsage
	api certv1.KeyUsage
}{
	{key: x509.KeyUsageDigitalSignature, api: certv1.UsageDigitalSignature},
	{key: x509.KeyUsageKeyEncipherment, api: certv1.UsageKeyEncipherment},
	{ext: x509.ExtKeyUsageServerAuth, api: certv1.UsageServerAuth},
	{ext: x509.ExtKeyUsageClientAuth, api: certv1.UsageClientAuth},
}

// Usages maps workload usages to spec.usages: digital signature, key
// encipherment, server auth and client auth. Any other usage is an error:
// meshca never asks for one.
func Usages(u csr.Usages) ([]certv1.KeyUsage, error) {
	var out []certv1.KeyUsage
	left := u.Key
	for _, m := range apiUsages {
		if m.key != 0 && u.Key&m.key != 0 {
			out = append(out, m.api)
			left &^= m.key
		}
	}
	if left != 0 {
		return nil, fmt.Errorf("key usage %q is not a workload usage", csr.Usages{Key: left}.Names())
	}
	for _, e := range u.Ext {
		found := false
		for _, m := range apiUsages {
			if m.key == 0 && m.ext == e {
				out, found = append(out, m.api), true
			}
		}
		if !found {
			return nil, fmt.Errorf("extended key usage %v is not a workload usage", e)
		}
	}
	return out, nil
}

// mayBeStored reports whether a Create that failed with err may have
// stored the object all the same: its answer was lost (the deadline, a
// cancel, the connection) or the apiserver failed or timed out (5xx). An
// answer of the 4xx family (AlreadyExists: another's object, Forbidden,
// Invalid, TooManyRequests...) stored nothing.
func mayBeStored(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if code := status.Status().Code; code >= 400 && code < 500 {
			return false
		}
	}
	return true
}

// delete removes the object (by name alone when c has no UID, not yet
// read back); it runs after ctx ended too, bounded by DeleteTimeout.
func (s *Signer) delete(ctx context.Context, c *certv1.CertificateSigningRequest) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.DeleteTimeout)
	defer cancel()
	opts := metav1.DeleteOptions{}
	if c.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &c.UID}
	}
	err := s.c.Client.CertificatesV1().CertificateSigningRequests().Delete(dctx, c.Name, opts)
	if err != nil && !isNotFound(err) && s.c.OnDeleteError != nil {
		s.c.OnDeleteError(fmt.Errorf("k8scsr: delete CertificateSigningRequest %s: %w", c.Name, err))
	}
}
