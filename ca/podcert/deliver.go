package podcert

import (
	"context"
	"fmt"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ReasonNotDelivered is the audit log's and the metric's reason of an
// answer decided but never written: a certificate that never left meshca,
// or a status write the apiserver refused for good.
const ReasonNotDelivered = "not_delivered"

// pending is what a controller holds of one request between its first
// signing attempt and the status write that delivers its answer: the
// answer is decided, and a certificate signed, once; a failed write is
// retried with the answer held, never by deciding again.
type pending struct {
	uid types.UID
	// failures counts the request's signing failures, toward
	// maxFailedAttempts: neither the apiserver's read errors nor an
	// unavailable backend count.
	failures int
	// answer is the status decided on resourceVersion decidedOn, at
	// start; d is its decision. Nil until decided.
	answer    *certv1.PodCertificateRequestStatus
	decidedOn string
	d         *Decision
	start     time.Time
	// abandoned: the apiserver refused the write for good (logged and
	// audited once); the request is left alone, never signed again.
	abandoned bool
}

// holds reports whether the controller holds something of key.
func (ctl *Controller) holds(key string) bool {
	ctl.heldMu.Lock()
	defer ctl.heldMu.Unlock()
	return ctl.held[key] != nil
}

func (ctl *Controller) hold(key string, p *pending) {
	ctl.heldMu.Lock()
	defer ctl.heldMu.Unlock()
	ctl.held[key] = p
}

// pendingOf is what is held of the request key, whose UID is uid; nil if
// nothing is. What is held of an earlier request of the same name is
// dropped.
func (ctl *Controller) pendingOf(ctx context.Context, key string, uid types.UID) *pending {
	ctl.heldMu.Lock()
	p := ctl.held[key]
	ctl.heldMu.Unlock()
	if p != nil && p.uid != uid {
		ctl.drop(ctx, key, "the request was replaced by another of the same name before its status was written")
		return nil
	}
	return p
}

// forget drops what is held of key.
func (ctl *Controller) forget(key string) *pending {
	ctl.heldMu.Lock()
	defer ctl.heldMu.Unlock()
	p := ctl.held[key]
	delete(ctl.held, key)
	return p
}

// drop forgets key, whose answer was not delivered: a certificate signed
// for it is audited as such (why), unless that was done already.
func (ctl *Controller) drop(ctx context.Context, key, why string) {
	if p := ctl.forget(key); p != nil && p.d != nil && p.d.Leaf != nil && !p.abandoned {
		ctl.undelivered(ctx, p, why)
	}
}

// undelivered audits and counts the answer of p as never delivered
// (failed, not_delivered), with the serial of its certificate if it has
// one.
func (ctl *Controller) undelivered(ctx context.Context, p *pending, why string) {
	d := p.d
	ctl.c.Issuer.RecordPod(ctx, &Decision{Request: d.Request, Identity: d.Identity,
		Condition: certv1.PodCertificateRequestConditionTypeFailed, Reason: ReasonNotDelivered,
		Detail:  fmt.Sprintf("%s; the answer %s (%s) was never delivered", why, d.Condition, d.Reason),
		Leaf:    d.Leaf,
		Latency: ctl.c.Now().Sub(p.start)})
}

// write writes the answer held in p on pcr, the request as last read. A
// refusal is audited once written (a decision with a certificate was
// audited before). A write the apiserver refuses for good (Forbidden,
// Invalid, BadRequest) is logged and audited once, and not retried; any
// other error is retried, after a read that shows whether the write
// committed after all (answered).
func (ctl *Controller) write(ctx context.Context, key string, p *pending, pcr *certv1.PodCertificateRequest) error {
	out := pcr.DeepCopy()
	out.Status = *p.answer.DeepCopy()
	_, err := ctl.c.Client.CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, out, metav1.UpdateOptions{})
	switch {
	case err == nil:
		ctl.forget(key)
		if p.d.Leaf == nil {
			ctl.c.Issuer.RecordPod(ctx, p.d)
		}
		return nil
	case apierrors.IsNotFound(err):
		ctl.drop(ctx, key, "the request was deleted before its status was written")
		return nil
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		p.abandoned = true
		ctl.log.ErrorContext(ctx, "the apiserver refused the status of a PodCertificateRequest; it is not written again",
			logRequest, key, logCondition, p.d.Condition, logReason, p.d.Reason, logError, err.Error())
		ctl.undelivered(ctx, p, "the apiserver refused the status write, which is not retried: "+err.Error())
		return nil
	}
	return fmt.Errorf("podcert: writing the status decided on resourceVersion %s: %w", p.decidedOn, err)
}

// answered settles the request key, which carries a terminal condition:
// the answer held for it was written by a write that returned an error
// (a refusal is then audited), or another writer answered first (a
// certificate held is then audited as never delivered).
func (ctl *Controller) answered(ctx context.Context, key string, p *pending, pcr *certv1.PodCertificateRequest) {
	if p == nil || p.answer == nil || !sameAnswer(&pcr.Status, p.answer) {
		ctl.drop(ctx, key, "another writer answered the request first")
		return
	}
	ctl.forget(key)
	if p.d.Leaf == nil {
		ctl.c.Issuer.RecordPod(ctx, p.d)
	}
}

// sameAnswer reports whether got is the status ours: the same chain for
// an Issued answer, the same condition otherwise.
func sameAnswer(got, ours *certv1.PodCertificateRequestStatus) bool {
	if ours.CertificateChain != "" || got.CertificateChain != "" {
		return got.CertificateChain == ours.CertificateChain
	}
	if len(got.Conditions) != 1 || len(ours.Conditions) != 1 {
		return false
	}
	g, o := got.Conditions[0], ours.Conditions[0]
	return g.Type == o.Type && g.Reason == o.Reason && g.Message == o.Message &&
		g.LastTransitionTime.Rfc3339Copy().Time.Equal(o.LastTransitionTime.Rfc3339Copy().Time)
}
