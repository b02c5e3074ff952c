package k8scsr

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// wait watches c until its signer issues or refuses it, or ctx ends. Every
// PollInterval it also reads the object, so that a watch that fails to
// start (the apiserver unavailable), ends or stalls only slows the answer
// down; a watch that ended is started again at the next read. A read or a
// watch the apiserver refuses (no get or watch permission, the API not
// served) fails the request at once, as classify says, rather than at
// the deadline.
func (s *Signer) wait(ctx context.Context, c *certv1.CertificateSigningRequest) (*certv1.CertificateSigningRequest, error) {
	csrs := s.c.Client.CertificatesV1().CertificateSigningRequests()
	rv := c.ResourceVersion
	var (
		w      watch.Interface
		events <-chan watch.Event
	)
	stop := func() {
		if w != nil {
			w.Stop()
			w, events = nil, nil
		}
	}
	defer stop()
	tick := time.NewTicker(s.c.PollInterval)
	defer tick.Stop()
	rewatch := true
	for {
		if w == nil && rewatch {
			rewatch = false
			opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", c.Name).String(), ResourceVersion: rv}
			nw, err := csrs.Watch(ctx, opts)
			switch {
			case err == nil:
				w, events = nw, nw.ResultChan()
			case refusedCall(err):
				return nil, classify("watch CertificateSigningRequest "+c.Name, err)
			}
		}
		var cur *certv1.CertificateSigningRequest
		select {
		case <-ctx.Done():
			return nil, signer.Errorf(name, signer.KindUnavailable,
				"signer %s did not answer CertificateSigningRequest %s before the request's deadline (%v): is its controller running and does it approve meshca's requests?",
				s.c.SignerName, c.Name, ctx.Err())
		case ev, ok := <-events:
			if !ok || ev.Type == watch.Error {
				stop() // read and watched again at the next tick
				continue
			}
			got, isCSR := ev.Object.(*certv1.CertificateSigningRequest)
			if !isCSR || got.Name != c.Name {
				continue
			}
			if ev.Type == watch.Deleted {
				return nil, deleted(c.Name)
			}
			cur = got
		case <-tick.C:
			rewatch = true
			got, err := csrs.Get(ctx, c.Name, metav1.GetOptions{})
			if isNotFound(err) {
				return nil, deleted(c.Name)
			}
			if refusedCall(err) {
				return nil, classify("get CertificateSigningRequest "+c.Name, err)
			}
			if err != nil {
				continue // the watch, or the next read, may still see the answer
			}
			cur = got
		}
		if cur.ResourceVersion != "" {
			rv = cur.ResourceVersion
		}
		if done, err := s.settled(cur); done || err != nil {
			return cur, err
		}
	}
}

func deleted(obj string) error {
	return signer.Errorf(name, signer.KindUnavailable, "CertificateSigningRequest %s was deleted before it was answered", obj)
}

// settled reports whether c is issued, or why its signer refused it (a
// Denied or Failed condition).
func (s *Signer) settled(c *certv1.CertificateSigningRequest) (bool, error) {
	for _, cond := range c.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Status != "" {
			continue
		}
		var verb string
		switch cond.Type {
		case certv1.CertificateDenied:
			verb = "denied"
		case certv1.CertificateFailed:
			verb = "failed"
		default:
			continue
		}
		return true, signer.Errorf(name, signer.KindRefused, "CertificateSigningRequest %s %s for signer %s: %s: %s",
			c.Name, verb, s.c.SignerName, bounded(cond.Reason), bounded(cond.Message))
	}
	return len(c.Status.Certificate) > 0, nil
}

// response checks the certificate the signer issued: meshca's rules
// (signer.CheckIssued), with the issuer's expiry as a limit and start as
// when the lifetime requested began.
func (s *Signer) response(req *signer.Request, c *certv1.CertificateSigningRequest, start time.Time) (*signer.Response, error) {
	parsed, err := pemutil.ParseCertificates(c.Status.Certificate)
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "CertificateSigningRequest %s: status.certificate: %v", c.Name, err)
	}
	leaf, chain := parsed[0], parsed[1:]
	var intermediates []*x509.Certificate
	for _, ca := range chain {
		if !certs.IsSelfSigned(ca) { // a root travels only in meshca's own bundle
			intermediates = append(intermediates, ca)
		}
	}
	if err := signer.CheckIssued(name, req, leaf, signer.Lifetime{Start: start, IssuerNotAfter: s.limit(leaf, chain)}); err != nil {
		return nil, signer.HintLifetime(err, fmt.Sprintf("signer %s must honour spec.expirationSeconds", s.c.SignerName))
	}
	return &signer.Response{Leaf: leaf, Intermediates: intermediates}, nil
}

// limit is the latest NotAfter leaf may have: the earliest expiry of the
// chain the signer returned; without one, the expiry of the root that
// signed leaf, or of the earliest root when none did; zero when Roots is
// nil.
func (s *Signer) limit(leaf *x509.Certificate, chain []*x509.Certificate) time.Time {
	if len(chain) > 0 {
		return certs.EarliestExpiry(chain...)
	}
	if s.c.Roots == nil {
		return time.Time{}
	}
	roots := s.c.Roots()
	for _, r := range roots {
		if leaf.CheckSignatureFrom(r) == nil {
			return r.NotAfter
		}
	}
	return certs.EarliestExpiry(roots...)
}

// classify maps a failed API call to whether a retry can help: the
// apiserver down, overloaded or timing out, or the deadline, is
// unavailable; a refusal (RBAC, validation, the API not served) needs an
// operator.
func classify(op string, err error) error {
	out := &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: fmt.Errorf("%s: %w", op, err)}
	var (
		status apierrors.APIStatus
		ne     net.Error
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.As(err, &ne):
	case apierrors.IsForbidden(err):
		out.Kind = signer.KindRefused
		out.Err = fmt.Errorf("%w: grant meshca's service account create, get, list, watch and delete on certificatesigningrequests", out.Err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsNotFound(err):
		out.Kind = signer.KindRefused
	case errors.As(err, &status):
		if code := status.Status().Code; code < 500 && code != 429 && code != 401 && code != 409 {
			out.Kind = signer.KindInternal
		}
	}
	return out
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// refusedCall reports whether a get or watch failed for a reason that no
// retry within the request mends: RBAC, validation, the API not served.
func refusedCall(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err)
}

// maxAnswerText bounds each of the reason and the message of an external
// signer's Denied or Failed condition in meshca's errors and logs.
const maxAnswerText = 256

// bounded is s as valid UTF-8 and at most maxAnswerText bytes, cut on a
// character boundary and ended with an ellipsis when it is longer.
func bounded(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxAnswerText {
		return s
	}
	const ellipsis = "…"
	cut := maxAnswerText - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
