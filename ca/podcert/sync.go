package podcert

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// defaultMaxExpiration is what the apiserver sets when a request names
// no spec.maxExpirationSeconds.
const defaultMaxExpiration = 86400

// refreshMargin is the API's margin between beginRefreshAt and either end
// of the certificate's life.
const refreshMargin = 10 * time.Minute

// sync answers the request key at most once, and signs for it at most
// once. It reads the request from the apiserver, not the cache, which may
// be behind an answer this or another replica wrote; the status is
// written with that read's resourceVersion, so that of two writers only
// one succeeds. An answer whose write fails is held (deliver.go) and only
// its write is retried: a status write that keeps failing never makes
// meshca sign again.
func (ctl *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key this controller queued
	}
	pcr, err := ctl.c.Client.CertificatesV1().PodCertificateRequests(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		ctl.drop(ctx, key, "the request was deleted before its status was written")
		return nil
	case err != nil:
		return fmt.Errorf("podcert: reading the request: %w", err)
	}
	p := ctl.pendingOf(ctx, key, pcr.UID)
	switch {
	case pcr.Spec.SignerName != ctl.c.SignerName, p != nil && p.abandoned:
		return nil
	case Answered(pcr):
		ctl.answered(ctx, key, p, pcr)
		return nil
	case p != nil && p.answer != nil:
		return ctl.write(ctx, key, p, pcr)
	}
	if p == nil {
		p = &pending{uid: pcr.UID}
	}
	start := ctl.c.Now()
	d := &Decision{Request: pcr}
	status, err := ctl.decide(ctx, pcr, d, p.failures)
	if err != nil {
		var r *retry
		if errors.As(err, &r) && (r.counted || r.leaf != nil) {
			if r.counted {
				p.failures++
			}
			ctl.hold(key, p)
			if r.leaf != nil {
				ctl.c.Issuer.RecordPod(ctx, &Decision{Request: pcr, Identity: d.Identity,
					Condition: certv1.PodCertificateRequestConditionTypeFailed, Reason: r.word,
					Detail: r.err.Error() + "; the certificate is discarded and the request retried", Leaf: r.leaf, Latency: ctl.c.Now().Sub(start)})
			}
		}
		return err
	}
	d.Latency = ctl.c.Now().Sub(start)
	p.answer, p.decidedOn, p.d, p.start = status, pcr.ResourceVersion, d, start
	ctl.hold(key, p)
	if d.Leaf != nil {
		// A signed certificate is audited before it can leave: a crash
		// after the write must not leave it unaudited.
		ctl.c.Issuer.RecordPod(ctx, d)
	}
	return ctl.write(ctx, key, p, pcr)
}

// Answered reports whether r carries one of the terminal conditions.
func Answered(r *certv1.PodCertificateRequest) bool {
	for _, c := range r.Status.Conditions {
		switch c.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied,
			certv1.PodCertificateRequestConditionTypeFailed:
			return true
		}
	}
	return false
}

// decide returns the status that answers r, which has had failures
// signing failures, and fills d; an error means no answer yet (retry),
// a *retry when IssuePod was called.
func (ctl *Controller) decide(ctx context.Context, r *certv1.PodCertificateRequest, d *Decision, failures int) (*certv1.PodCertificateRequestStatus, error) {
	id, err := ctl.check(ctx, r)
	d.Identity = id
	var ref *Refusal
	if errors.As(err, &ref) {
		return ctl.refuse(r, d, ref), nil
	}
	if err != nil {
		return nil, err
	}
	maxLife := maxLifetime(r)
	if maxLife < MinLifetime { // under the API's minimum: no lifetime is within bounds, sign nothing
		return ctl.refuse(r, d, denied(ReasonInvalidRequest, "max_expiration_too_short", fmt.Sprintf(
			"spec.maxExpirationSeconds %d is under the API's minimum lifetime of %d seconds: no certificate can satisfy it",
			maxLife/time.Second, MinLifetime/time.Second))), nil
	}
	iss, err := ctl.c.Issuer.IssuePod(ctx, &IssueRequest{StubPKCS10: r.Spec.StubPKCS10Request, ID: id,
		Lifetime: min(maxLife, ctl.c.MaxTTL), Node: string(r.Spec.NodeName)})
	if err != nil {
		var se *SignedError
		if errors.As(err, &se) {
			d.Leaf = se.Leaf
		}
		if ref := refusalOf(err, failures); ref != nil {
			d.Detail = err.Error()
			return ctl.refuse(r, d, ref), nil
		}
		out := &retry{err: err, counted: !transient(err)}
		if se != nil {
			out.leaf, out.word, d.Leaf = se.Leaf, cmp.Or(se.Reason, "issued_unverified"), nil
		}
		return nil, out
	}
	d.Leaf, d.Issuer = iss.Leaf, iss.Issuer
	nb, na := iss.Leaf.NotBefore, iss.Leaf.NotAfter
	if life := na.Sub(nb); life < MinLifetime || life > maxLife {
		d.Detail = fmt.Sprintf("issued for %v, outside [%v, %v]", life, MinLifetime, maxLife)
		return ctl.refuse(r, d, failed(ReasonLifetime, "lifetime_out_of_range",
			fmt.Sprintf("the signing backend issued a certificate for %v, outside the request's bounds [%v, %v]; the CA operator must check its lifetime", life, MinLifetime, maxLife))), nil
	}
	d.Condition, d.Reason = certv1.PodCertificateRequestConditionTypeIssued, "ok"
	return &certv1.PodCertificateRequestStatus{
		Conditions:       []metav1.Condition{ctl.condition(r, d.Condition, ReasonIssued, "issued "+id.String())},
		CertificateChain: iss.ChainPEM,
		NotBefore:        &metav1.Time{Time: nb},
		NotAfter:         &metav1.Time{Time: na},
		BeginRefreshAt:   &metav1.Time{Time: ctl.refreshAt(nb, na)},
	}, nil
}

// refuse answers r with ref; d keeps the leaf of a certificate signed and
// then refused, for its serial, but the status never carries it.
func (ctl *Controller) refuse(r *certv1.PodCertificateRequest, d *Decision, ref *Refusal) *certv1.PodCertificateRequestStatus {
	d.Condition, d.Reason = ref.Condition, ref.Word
	if d.Detail == "" {
		d.Detail = ref.Message
	}
	return &certv1.PodCertificateRequestStatus{Conditions: []metav1.Condition{ctl.condition(r, ref.Condition, ref.Reason, ref.Message)}}
}

func (ctl *Controller) condition(r *certv1.PodCertificateRequest, typ, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg,
		ObservedGeneration: r.Generation, LastTransitionTime: metav1.NewTime(ctl.c.Now())}
}

// maxLifetime is the request's spec.maxExpirationSeconds.
func maxLifetime(r *certv1.PodCertificateRequest) time.Duration {
	s := int32(defaultMaxExpiration)
	if r.Spec.MaxExpirationSeconds != nil {
		s = *r.Spec.MaxExpirationSeconds
	}
	return time.Duration(s) * time.Second
}

// refreshAt is about half of the lifetime, ±5% of it at random, and within
// the API's bounds; whole seconds, as the API stores them.
func (ctl *Controller) refreshAt(nb, na time.Time) time.Time {
	life := na.Sub(nb)
	t := nb.Add(life/2 + time.Duration((ctl.c.Jitter()-0.5)*float64(life)/10))
	if lo := nb.Add(refreshMargin); t.Before(lo) {
		t = lo
	}
	if hi := na.Add(-refreshMargin); t.After(hi) {
		t = hi
	}
	return t.Truncate(time.Second)
}

// check returns the identity of r's Pod, or the Refusal of a request
// whose Pod, service account or node is not the one it names, is
// terminating, or is in a namespace the operator does not allow. It asks
// the apiserver, never a cache: a Pod deleted or replaced a moment ago
// gets no certificate.
func (ctl *Controller) check(ctx context.Context, r *certv1.PodCertificateRequest) (spiffeid.ID, error) {
	ns, s := r.Namespace, r.Spec
	if len(s.UnverifiedUserAnnotations) > 0 {
		return spiffeid.ID{}, denied(certv1.PodCertificateRequestConditionInvalidUserConfig, "user_annotations",
			"meshca's signer takes no unverifiedUserAnnotations: remove them from the podCertificate volume")
	}
	if !ctl.c.Namespaces.Empty() {
		n, err := ctl.c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if n, err = found(n, err, "namespace"); err != nil {
			return spiffeid.ID{}, err
		}
		if n == nil || !ctl.c.Namespaces.Matches(labels.Set(n.Labels)) {
			return spiffeid.ID{}, denied(ReasonNamespaceNotAllowed, "namespace_not_allowed",
				fmt.Sprintf("namespace %s is not selected by meshca's pod certificate namespace selector %q", ns, ctl.c.Namespaces))
		}
	}
	pod, err := ctl.c.Client.CoreV1().Pods(ns).Get(ctx, s.PodName, metav1.GetOptions{})
	if pod, err = found(pod, err, "pod"); err != nil {
		return spiffeid.ID{}, err
	}
	if ref := podRefusal(pod, r); ref != nil {
		return spiffeid.ID{}, ref
	}
	sa, err := ctl.c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, s.ServiceAccountName, metav1.GetOptions{})
	if sa, err = found(sa, err, "service account"); err != nil {
		return spiffeid.ID{}, err
	}
	if sa == nil || sa.UID != s.ServiceAccountUID {
		return spiffeid.ID{}, denied(ReasonServiceAccount, "service_account_mismatch",
			fmt.Sprintf("service account %s/%s with UID %s no longer exists", ns, s.ServiceAccountName, s.ServiceAccountUID))
	}
	node, err := ctl.c.Client.CoreV1().Nodes().Get(ctx, string(s.NodeName), metav1.GetOptions{})
	if node, err = found(node, err, "node"); err != nil {
		return spiffeid.ID{}, err
	}
	if node == nil || node.UID != s.NodeUID {
		return spiffeid.ID{}, denied(ReasonNode, "node_mismatch", fmt.Sprintf("node %s with UID %s no longer exists", s.NodeName, s.NodeUID))
	}
	id, err := spiffeid.FromSegments(ctl.c.TrustDomain, "ns", ns, "sa", s.ServiceAccountName)
	if err != nil {
		return spiffeid.ID{}, denied(ReasonInvalidIdentity, "invalid_identity",
			fmt.Sprintf("namespace %s and service account %s make no valid SPIFFE ID: %v", ns, s.ServiceAccountName, err))
	}
	return id, nil
}

// podRefusal checks the live Pod (nil: not found) against the request.
func podRefusal(pod *corev1.Pod, r *certv1.PodCertificateRequest) *Refusal {
	s, name := r.Spec, r.Namespace+"/"+r.Spec.PodName
	switch {
	case pod == nil:
		return denied(ReasonPodNotFound, "pod_gone", fmt.Sprintf("pod %s no longer exists", name))
	case pod.UID != s.PodUID:
		return denied(ReasonPodReplaced, "pod_replaced", fmt.Sprintf("pod %s is now UID %s, not the requesting UID %s", name, pod.UID, s.PodUID))
	case pod.Status.Phase == corev1.PodSucceeded, pod.Status.Phase == corev1.PodFailed:
		// A Pod being deleted is not refused: it runs, and may need its
		// certificate refreshed, until its containers stop.
		return denied(ReasonPodTerminating, "pod_terminating", fmt.Sprintf("pod %s has terminated (%s)", name, pod.Status.Phase))
	case pod.Spec.ServiceAccountName != s.ServiceAccountName:
		return denied(ReasonServiceAccount, "service_account_mismatch",
			fmt.Sprintf("pod %s runs as service account %s, not %s", name, pod.Spec.ServiceAccountName, s.ServiceAccountName))
	case pod.Spec.NodeName != string(s.NodeName):
		return denied(ReasonNode, "node_mismatch", fmt.Sprintf("pod %s is on node %q, not %s", name, pod.Spec.NodeName, s.NodeName))
	}
	return nil
}

// found is the answer of a GET: obj, nil when it was not found (client-go
// returns an empty object then), or the error to retry on.
func found[T any](obj *T, err error, what string) (*T, error) {
	switch {
	case err == nil:
		return obj, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	}
	return nil, fmt.Errorf("podcert: reading the %s: %w", what, err)
}
